# lifeboat: live-migrate VMs on Kubernetes instead of losing them to node-pressure eviction.
#
#   make demo        bring up a local cluster, run a VM, evict its pod the kubelet way and watch it live-migrate
#   make test        everything CI runs: generated files fresh, lint, unit and integration tests
#   make test-security  only the attacks docs/security.md lists, each shown refused
#   make deps        install the Debian packages both need (make demo and make test do it first; quick when done)
#   make generate    regenerate deep-copy, clients, informers, listers and CRDs from api/
#   make demo-down   stop the demo cluster
#   make bench       benchmarks (control plane start-up, evacuation mark latency, eviction webhook latency)
#   make bench-report    every benchmark below, one after another: each table, its raw output and its charts in docs/bench
#   make bench-deadline  the migration deadline matrix (real libvirt and TCG guests; about 47 min a run)
#   make bench-drain     drain throughput: 10 VMs leaving one node through the real cluster (3 min a run)
#   make bench-node-full 50 VMs on one node drained: the agent's memory and CPU, idle and during it
#   make bench-scale     1,000 VMIs on 100 hollow nodes: the controller's memory, CPU and API calls
#   make bench-density   memory each VM costs its node beyond the guest's, by process (1 and 2 vCPUs, TCG and KVM)
#   make bench-startup   VMI creation to Running beside ordinary pods, and the API calls per start
#   make bench-network   the network interruption of a VM behind a Service during its migration
#   make bench-transport one migration over plain TCP and over TLS 1.3, interleaved
#   make bench-downtime  pre-copy downtime as the guest sees it with QEMU's target and lifeboat's, interleaved
#   make bench-mirror    disk-writing guests migrated with the synchronous disk mirror and the background copy
#   make bench-relief    node-pressure relief on and off on the real kubelet, 3 runs (4 min a run)
#   make bench-stock     a drain on the stock cluster (two real kubelets, upstream defaults) beside the configured one, and the relief margin
#   make images      lifeboat's container images as OCI archives in .images/ (for ctr images import)
#   make push REGISTRY=host[:port][/path]  lifeboat's images pushed there, tagged TAG (default: the commit)
#   make manifests-check  apply manifests/ to a local control plane and check every object
#   make soak        operations and faults at random while VMs move, judged by an independent checker (SOAK_DURATION, SOAK_SEED, SOAK_VMS, SOAK_REAL_NODE=1)
#   make e2e         lifeboat deployed from manifests/ on a real kubelet, whose soft eviction it turns into a live migration

SHELL := /bin/bash
GO ?= go

CODE_GENERATOR_VERSION  := v0.37.2
CONTROLLER_TOOLS_VERSION := v0.23.0
STATICCHECK_VERSION     := v0.8.2

MODULE    := github.com/lifeboat-vm/lifeboat
API_PKG   := $(MODULE)/api/lifeboat/v1alpha1
CLIENT    := $(MODULE)/api/client
HEADER    := api/boilerplate.go.txt
CODEGEN   := $(GO) run k8s.io/code-generator/cmd
DEMO_DIR  ?= $(CURDIR)/.demo/cluster
# The emulated nodes' host paths; short, because launchers' unix sockets live under it.
DEMO_NODES ?= /tmp/lifeboat-demo
CLUSTER   := bin/lifeboat-cluster

SOAK_DURATION ?= 10m
SOAK_SEED ?= 47
SOAK_VMS ?= 3
# 1 adds a real kubelet node (test/realnode) to the soak's three emulated ones. Off by default: the
# plan of a seed depends on the number of nodes, so a seed's recorded soak replays only as it ran.
SOAK_REAL_NODE ?= 0

.PHONY: soak deps all generate verify-generated lint test bench bench-report bench-deadline bench-drain bench-node-full bench-scale bench-density bench-startup bench-network bench-transport bench-downtime bench-mirror bench-relief bench-stock test-security fuzz binaries lifeboat-bins demo demo-down clean images push manifests-check e2e

all: test

# Every target that builds cgo (libvirt) or runs guests needs these; quick and silent once installed.
deps:
	@hack/install-deps

generate:
	$(CODEGEN)/deepcopy-gen@$(CODE_GENERATOR_VERSION) --go-header-file $(HEADER) --output-file zz_generated.deepcopy.go ./api/lifeboat/v1alpha1
	rm -rf api/client
	$(CODEGEN)/client-gen@$(CODE_GENERATOR_VERSION) --go-header-file $(HEADER) --clientset-name versioned \
		--input-base "" --input $(API_PKG) --output-dir api/client/clientset --output-pkg $(CLIENT)/clientset
	$(CODEGEN)/lister-gen@$(CODE_GENERATOR_VERSION) --go-header-file $(HEADER) \
		--output-dir api/client/listers --output-pkg $(CLIENT)/listers ./api/lifeboat/v1alpha1
	$(CODEGEN)/informer-gen@$(CODE_GENERATOR_VERSION) --go-header-file $(HEADER) \
		--versioned-clientset-package $(CLIENT)/clientset/versioned --listers-package $(CLIENT)/listers \
		--output-dir api/client/informers --output-pkg $(CLIENT)/informers ./api/lifeboat/v1alpha1
	rm -f manifests/crds/*.yaml
	$(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION) \
		crd paths=./api/lifeboat/... output:crd:artifacts:config=manifests/crds

# Regenerates into a scratch copy and compares, so it works on a dirty tree and changes nothing.
verify-generated:
	@scratch=$$(mktemp -d); trap 'rm -rf "$$scratch"' EXIT; \
	cp -r go.mod go.sum api manifests "$$scratch"/ && \
	$(MAKE) --no-print-directory -s -C "$$scratch" -f $(CURDIR)/Makefile generate >"$$scratch/generate.log" 2>&1 \
		|| { cat "$$scratch/generate.log"; exit 1; }; \
	if ! diff -r api "$$scratch/api" >/dev/null || ! diff -r manifests/crds "$$scratch/manifests/crds" >/dev/null; then \
		diff -r api "$$scratch/api"; diff -r manifests/crds "$$scratch/manifests/crds"; \
		echo "generated files are stale: run make generate and commit the result"; exit 1; \
	fi; echo "generated files are up to date"

lint: deps
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@# The generated clients keep code-generator's choices (deprecated ListWatch fields); verify-generated covers them.
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) $$($(GO) list ./... | grep -v /api/client/)

# The control plane binaries are built from test/tools once and cached (see test/controlplane).
binaries: deps
	$(GO) run ./test/cmd/lifeboat-cluster build

# Tests that need a KVM host (or, for TCG, QEMU >= 9.0) skip elsewhere; they are listed here, never skipped silently.
KVM_ONLY_TESTS := TestPostCopyFinishesANonConvergingMigration|TestMigrationPastTheFirstPassMovesADirtyingGuestIntact|TestPostCopyResumesAfterTheConnectionBreaks

# Tests that need a device the machine may lack (/dev/userfaultfd, Linux 6.1 and later) skip where it
# is missing; they run on their own with their outcome printed, never skipped silently.
DEVICE_TESTS := TestARestrictedVMIsReceivedInPostCopy

# Tests that need root (the libvirtd shim runs only a root caller's daemons) skip for other users;
# they run on their own with their outcome printed, never skipped silently.
ROOT_TESTS := TestTheShimAdoptsTheDaemonsQEMU

# Tests that need cgroup v1's cpu controller at /sys/fs/cgroup/cpu, writable (the emulated node's
# pods' CPU share) skip where it is missing; they run on their own with their outcome printed,
# never skipped silently.
CGROUP_TESTS := TestPodCPUSharesHoldEveryProcessOfTheContainer

# The end-to-end package alone took 40 min in a clean-clone CI run on the 2-core AMD machine
# with nothing else running (2026-11-29, 450f6ca: it boots and migrates dozens of TCG guests), so
# its limit is 55 min; CI's 90 min hold the whole run.
test: deps verify-generated lint binaries
	$(GO) test -count=1 -timeout 55m -skip '^($(DEVICE_TESTS)|$(ROOT_TESTS)|$(CGROUP_TESTS))$$' ./...
	@set -o pipefail; $(GO) test -count=1 -v -run '^($(ROOT_TESTS))$$' ./domain/ | grep -E -- '--- (SKIP|PASS|FAIL)|^ +[a-z_]+_test.go:'
	@set -o pipefail; $(GO) test -count=1 -v -run '^($(KVM_ONLY_TESTS))$$' ./domain/ | grep -E -- '--- (SKIP|PASS|FAIL)|^ +[a-z_]+_test.go:'
	@set -o pipefail; $(GO) test -count=1 -v -timeout 10m -run '^($(DEVICE_TESTS))$$' ./test/e2e/ | grep -E -- '--- (SKIP|PASS|FAIL)|^ +[a-z_]+_test.go:'
	@set -o pipefail; $(GO) test -count=1 -v -timeout 5m -run '^($(CGROUP_TESTS))$$' ./test/node/ | grep -E -- '--- (SKIP|PASS|FAIL)|^ +[a-z_]+_test.go:'

# Every attack docs/security.md lists, each shown refused against real processes and the real API
# server (make test runs them too, with everything else).
SECURITY_TESTS := TestAGuestThatSpoofsIsSeenOnlyAsItself|TestAGuestSendsOnlyAsItself|TestFilterRules|TestTargetProxyRefusesAllButTheMigrationsSource|TestSourceProxyRefusesAnotherTarget|TestReview|FuzzDecodeReview|FuzzRead|TestReadRejectsMalformedFrames|TestBadConnectionsAreClosedAloneAndCounted|TestUnauthorisedPeerIsRejected|TestConnectionsPerSocketAreBounded|TestListenOpensTheSocketToThePodAndReplacesOnlyASocket|TestDialRefusesASymlinkToAnotherSocket|TestAgentsGetCertificatesForTheirOwnNodeOnly|TestAnAgentWritesOnlyWhatBelongsToItsNode|TestTheControllerCreatesOnlyLauncherPods|TestRBACAllowsWhatTheCodeDoesAndNoMore|TestOnlyTheirOwnersSteerAnEvacuation|TestANamespaceUserCannotReachTheNodesFiles|TestWorkloadPodsAreAdmitted|TestInvalidInputIsRejected|TestAPIEvictionFinalAnswers|TestSlowClientsDoNotStarveTheEndpoints|TestRestrictedLaunchersRunMoveAndReachOnlyTheirOwnSockets|TestLauncherPodsAreRestricted|TestTheControllersMetricsAnswerOnlyCallersAllowedToReadThem|TestARestrictedVMIsReceivedInPostCopy|TestAuthenticate|TestUnauthenticated|TestModeOf|TestTheRatchet|TestAPermissiveWebhookMarksOnce|TestTheWebhooksRatchetCannotBeUndone|TestTheWebhookStaysStrictOnceTheAPIServerAuthenticated|TestAWebhookTheAPIServerCannotAuthenticate|TestTheWebhookPortAdmitsOnlyCallersOutsideThePodNetwork|TestALookAlikeLauncherMovesNothing|TestLinkPod|TestRecordedPods|TestNextStatusRecordsTheLauncherPod|TestTheTargetPodIsRecordedByNameAndUID|TestOnlyLifeboatLabelsLaunchersAndMigrations|TestATenantCannotStarveEvacuations|TestOnlyTheControllerRecordsAnEvacuation|TestPlan|TestAdmit|TestAnInotifyOverflowRescansInsteadOfEnding|TestAWatcherErrorRescansAndKeepsDiscovering|TestTheAgentKeepsServingThroughAnInotifyOverflow|TestAStalledLauncherHoldsOneWorkerAndTheOthersAreEvacuatedOnTime|TestADaemonThatNeverAnswersDoesNotHoldTheDial|TestAMigrationsLoopTakesNoWorkersTurn|TestTheAgentsPrivilegesArePinned|TestOnlyLaunchersGetDevices|TestOffersOnlyWhatLaunchersAskFor|TestReviewAsksRBACOnlyOfOthersThanTheNodesAgent|TestOverlayLeavesTheImageUntouchedAndRefusesBackingFiles|TestQCOW2DataFileReadsOnlyTheHeader|TestAFloodedConsoleLogIsEmptiedAndStaysSmall|TestTheRunVolumeIsBounded|TestTheConsoleDropsEscapesAimedAtTheTerminal|TestOnlyTheAccountThePoliciesNameStarts|TestThePoliciesNameLifeboatsOwnServiceAccounts|TestAControllerThePoliciesDoNotNameRefusesToStart|TestOnlyTheSignerReadsTheMigrationCAKey|TestTheControllersTokenCreatesOnlyWhatALauncherNeeds|TestTheControllersTokenChangesOnlyWhatLifeboatWrites|TestControlNodes|TestTheControllerRefusesWhatAdmissionMissed|TestAnAgentChangesOnlyItsNodesReliefLabel|TestAKubeletCannotUnmarkItsVMNode|TestAnUnlinkedLauncherPutsNoEventOnTheVMIItNames|TestAStrayOfADeletedPodIsReportedOnItsVMI|TestAStrayCheckTrustsThePodsNamespaceOverTheDomainsName|TestOnlyLifeboatWritesItsStatusRecords|TestTheTenantRolesRunVMsAndWriteNoStatus|TestAStatusWriterCannotSetLifeboatLabels|TestTheLibvirtClientRunsConfined|TestAChildThatBreaksTheProtocolEndsItsConnectionOnly|TestConfinementProblem|TestALibvirtRelayTakesItsChildsConnectionsWithinItsBound|FuzzTheChildsReplies|TestTellReachesOnlyThatVMIsLauncher|TestAHostileLauncherCannotMakeTheAgentStartChildrenInALoop|TestDialDelay|TestALauncherCannotInflateItsLibvirtdRestarts|TestALauncherCannotFloodTheAgentsLog|TestTheChildsFilterRefusesNamespacesAndMounts|TestTheChildsFilterVerdicts|TestTheChildsFilterKillsAnotherABIsSystemCall|TestALauncherGetsItsOwnCopyOfTheNodesQEMUCapabilities
test-security: deps binaries
	$(GO) test -count=1 -timeout 30m -run '^($(SECURITY_TESTS))$$' ./agent/... ./api/... ./cmd/... ./evacuation/... ./launcher/... ./test/manifests/ ./test/integration/ ./test/e2e/
	$(MAKE) --no-print-directory fuzz

# The fuzz targets of the security tests, each fuzzed for FUZZ_TIME beyond its seed corpus (which
# test-security's -run covers); go test fuzzes one target of one package per run.
FUZZ_TIME ?= 20s
FUZZ_TARGETS := FuzzDecodeReview:./evacuation/webhook/ FuzzRead:./api/notify/ FuzzTheChildsReplies:./agent/libvirtclient/
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  echo "fuzzing $${t%%:*} ($${t#*:}) for $(FUZZ_TIME)"; \
	  $(GO) test -count=1 -run '^$$' -fuzz "^$${t%%:*}\$$" -fuzztime=$(FUZZ_TIME) "$${t#*:}"; \
	done

# A soak (test/soak, docs/benchmarks.md): the seed's plan of operations and faults carried out on
# three emulated nodes (and a real kubelet node with SOAK_REAL_NODE=1) with real guests, then the
# checker's report; the same seed replays the same plan.
soak: binaries
	$(GO) test -count=1 -v -timeout 0 -run '^TestSoak$$' ./test/e2e/ -args -soak-duration=$(SOAK_DURATION) -soak-seed=$(SOAK_SEED) -soak-vms=$(SOAK_VMS) \
	  -soak-real-node=$(if $(filter 1,$(SOAK_REAL_NODE)),true,false)

# Benchmarks; figures and how to read them: docs/benchmarks.md. Each target writes into BENCH_OUT
# (docs/bench, beside the report): NAME.log, the whole output (not committed: docs/bench/.gitignore);
# NAME.txt, the result lines alone, which benchstat reads (go run
# golang.org/x/perf/cmd/benchstat@... NAME.txt gives the table again); NAME.benchstat.txt,
# benchstat's table; and the benchmark's charts, NAME*.svg (LIFEBOAT_BENCH_OUT, test/internal/chart).
BENCH_OUT ?= $(CURDIR)/docs/bench
BENCHSTAT := $(GO) run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
# The benchmarks print progress while they run, between a result's name and its figures:
# BENCH_RESULTS puts the name back on each result line so that benchstat reads every run.
BENCH_RESULTS := awk '/^Benchmark/ {name = $$1; if (/ns\/op/) print; next} /^ +[0-9]+\t.*ns\/op/ {print name $$0; next} /^(goos|goarch|pkg|cpu):/'
# $(call bench_run,NAME,BENCHSTAT OPTIONS,COMMAND): runs COMMAND, keeps its output as NAME.log and
# its result lines as NAME.txt, and writes benchstat's table of them as NAME.benchstat.txt. It fails
# when a benchmark failed: go test exits 0 when a sub-benchmark fails in a -count run after its first.
define bench_run
	@set -o pipefail; mkdir -p $(BENCH_OUT); \
	{ $(3) ; } 2>&1 | tee $(BENCH_OUT)/$(1).log /dev/stderr | $(BENCH_RESULTS) > $(BENCH_OUT)/$(1).txt && \
	if grep -q -e '--- FAIL:' $(BENCH_OUT)/$(1).log; then echo "$(1): a benchmark failed; see $(BENCH_OUT)/$(1).log" >&2; exit 1; fi && \
	$(BENCHSTAT) $(2) $(BENCH_OUT)/$(1).txt | tee $(BENCH_OUT)/$(1).benchstat.txt
endef
BENCH_TARGETS := bench bench-deadline bench-drain bench-density bench-startup bench-scale bench-network bench-transport bench-downtime bench-mirror bench-relief bench-stock
$(BENCH_TARGETS): export LIFEBOAT_BENCH_OUT = $(BENCH_OUT)

# Control plane start-up, evacuation mark latency, eviction webhook latency: about 6 minutes.
bench: binaries
	$(call bench_run,bench,,$(GO) test -run '^$$' -bench 'BenchmarkMarkLatency|BenchmarkStart|BenchmarkWebhookEvictions' -benchtime=1x -count=5 -timeout 60m ./test/bench/ ./test/controlplane/)

# Long: every cell boots a guest and migrates it (about 47 min a run); not part of make bench.
# The matrix's own table: deadline-matrix.md; its charts: deadline-matrix.svg, deadline-timelines/.
BENCH_COUNT ?= 1
bench-deadline: deps
	$(call bench_run,deadline,,$(GO) test -run '^$$' -bench BenchmarkDeadlineMatrix -benchtime=1x -count=$(BENCH_COUNT) -timeout 0 ./test/bench/)
	grep '^| ' $(BENCH_OUT)/deadline.log > $(BENCH_OUT)/deadline-matrix.md

# Drain throughput: DRAIN_VMS VMs leaving one node through the real cluster (about a minute a run
# with 10).
DRAIN_VMS ?= 10
bench-drain: binaries
	$(call bench_run,drain-$(DRAIN_VMS)vms,,$(GO) test -run '^$$' -bench BenchmarkDrainThroughput -benchtime=1x -count=$(BENCH_COUNT) -timeout 0 ./test/e2e/ -args -drain-vms=$(DRAIN_VMS))

# A node full of VMs: the drain benchmark with 50 small guests on one node (about 4.5 min a run).
bench-node-full:
	$(MAKE) bench-drain DRAIN_VMS=50 BENCH_COUNT=$(BENCH_COUNT)

# What a VM costs its node beyond its guest's memory, by process: 6 runs (benchstat's minimum for a
# confidence interval), about 30 minutes.
DENSITY_COUNT ?= 6
bench-density: binaries
	$(call bench_run,density,,$(GO) test -run '^$$' -bench BenchmarkDensity -benchtime=1x -count=$(DENSITY_COUNT) -timeout 0 ./test/e2e/)

# KubeVirt's density method: VMIs created 100 ms apart, creation to Running, p50 and p95, beside as
# many ordinary pods in the same run, and the API calls per VMI start (about 6 minutes). KubeVirt
# creates 100; 40 TCG guests held 9.1 GiB here at the peak, so 100 would not fit in 24 GiB:
# STARTUP_VMIS=100 on a machine with 32 GiB or more, or STARTUP_ACCEL=kvm where /dev/kvm opens (the
# guests' pages are then only what their kernels touched before they stop or boot).
STARTUP_VMIS ?= 40
STARTUP_COUNT ?= 3
STARTUP_ACCEL ?= tcg
bench-startup: binaries
	$(call bench_run,startup$(if $(filter-out 40,$(STARTUP_VMIS)),-$(STARTUP_VMIS)vmis),,$(GO) test -run '^$$' -bench BenchmarkCreationToRunning -benchtime=1x -count=$(STARTUP_COUNT) -timeout 0 ./test/e2e/ -args -startup-vmis=$(STARTUP_VMIS) -startup-accel=$(STARTUP_ACCEL))

# The cluster side at scale: 1,000 VMIs on 100 hollow nodes (stand-ins for kubelets and agents,
# package test/hollow) with the real API server, scheduler, controller manager and
# lifeboat-controller: creation to Running beside ordinary pods, the controller's memory and CPU,
# its API calls per VMI start, per evacuation of a drain and per idle hour (about 20 minutes).
SCALE_COUNT ?= 3
bench-scale: binaries
	$(call bench_run,scale,,$(GO) test -run '^$$' -bench BenchmarkClusterScale -benchtime=1x -count=$(SCALE_COUNT) -timeout 0 ./test/e2e/)

# A VM on the pod network, behind a Service, live-migrated while a client asks every 20 ms:
# the longest interruption beside the guest's stop and the migration's downtime (about 2 minutes);
# chart network.svg; each run's timeline of the switch in network-timelines.txt, printed at the end.
NETWORK_COUNT ?= 5
bench-network: binaries
	@mkdir -p $(BENCH_OUT); rm -f $(BENCH_OUT)/network-timelines.txt
	$(call bench_run,network,,NETWORK_TIMELINES=$(BENCH_OUT)/network-timelines.txt $(GO) test -run '^$$' -bench BenchmarkMigrationNetworkInterruption -benchtime=1x -count=$(NETWORK_COUNT) -timeout 0 ./test/e2e/)
	@cat $(BENCH_OUT)/network-timelines.txt

# The same migration over plain TCP and over TLS 1.3 between the proxies, uncapped and capped,
# interleaved: each round runs every case once (go test's -count would repeat each case back to
# back); real libvirt daemons and TCG guests (about 2.5 minutes).
TRANSPORT_COUNT ?= 5
bench-transport: deps
	$(call bench_run,transport,-col /transport,for i in $$(seq $(TRANSPORT_COUNT)); do \
	  $(GO) test -run '^$$' -bench 'BenchmarkMigrationTransport|BenchmarkStream' -benchtime=1x -timeout 0 ./test/bench/ ./agent/migrationproxy/ || exit 1; \
	done)

# Pre-copy downtime with QEMU's target (300 ms) and lifeboat's, interleaved: DOWNTIME_COUNT runs of
# both (about 1.5 min a round), then benchstat's medians by target.
DOWNTIME_COUNT ?= 5
bench-downtime: deps
	$(call bench_run,downtime,-col /target,for i in $$(seq $(DOWNTIME_COUNT)); do \
	  $(GO) test -run '^$$' -bench 'BenchmarkDowntimeTarget' -benchtime=1x -timeout 0 ./test/bench/ || exit 1; \
	done)

# The disk-writing guests with the synchronous disk mirror and with the background copy: MIRROR_COUNT
# runs of both (about 1.5 min a run), then benchstat's medians by mirror mode.
MIRROR_COUNT ?= 3
bench-mirror: deps
	$(call bench_run,mirror,-col /mirror,$(GO) test -run '^$$' -bench 'BenchmarkDiskMirrorMode' -benchtime=1x -count=$(MIRROR_COUNT) -timeout 0 ./test/bench/)

# Node-pressure relief on the real kubelet, on and off in each run: benchstat's medians of 3 runs
# (about 3 min a run).
bench-relief: binaries
	$(call bench_run,relief,,$(GO) test -run '^$$' -bench BenchmarkRealNodeRelief -benchtime=1x -count=3 -timeout 0 ./test/e2e/)

# Every table and chart of docs/benchmarks.md, one benchmark after another, into BENCH_OUT: about
# 4 h on the 2-core development machine (all but the deadline matrix took 1 h 45 min; the matrix's
# three runs about 2 h); run nothing else meanwhile. Stops at the first benchmark that fails.
bench-report:
	$(MAKE) bench
	$(MAKE) bench-deadline BENCH_COUNT=3
	$(MAKE) bench-drain BENCH_COUNT=3
	$(MAKE) bench-node-full
	$(MAKE) bench-density
	$(MAKE) bench-startup
	$(MAKE) bench-startup STARTUP_VMIS=10
	$(MAKE) bench-scale
	$(MAKE) bench-network NETWORK_COUNT=10
	$(MAKE) bench-transport
	$(MAKE) bench-downtime
	$(MAKE) bench-mirror
	$(MAKE) bench-relief
	$(MAKE) bench-stock

# kubectl drain of a node on the stock cluster (test/stockcluster: upstream defaults, lifeboat
# installed as the README says) beside the cluster configured for lifeboat, and the relief margin
# on a default kubelet: STOCK_COUNT runs of each (about 1.5 min a run, each bringing its cluster up).
STOCK_COUNT ?= 3
bench-stock: binaries
	$(call bench_run,stock,,$(GO) test -run '^$$' -bench 'Benchmark(Stock|Configured)ClusterDrain' -benchtime=1x -count=$(STOCK_COUNT) -timeout 0 ./test/stockcluster/)

# The Debian layer of the agent and launcher images is built once with mmdebstrap and cached (test/images).
IMAGES_DIR ?= $(CURDIR)/.images
images: deps
	$(GO) run ./test/cmd/lifeboat-images build -out $(IMAGES_DIR)

# The same images pushed to a registry, for a cluster whose nodes pull (README, "Install on a
# cluster"): REGISTRY/lifeboat-{agent,controller,launcher}:TAG, with docker login's credentials.
# A new TAG per build, so that nodes pull the new images (IfNotPresent keeps a tag they have).
TAG ?= $(shell git rev-parse --short=12 HEAD)
push: deps
	@test -n "$(REGISTRY)" || { echo "usage: make push REGISTRY=host[:port][/path] [TAG=...]"; exit 2; }
	$(GO) run ./test/cmd/lifeboat-images push -registry $(REGISTRY) -tag $(TAG)

# manifests/ rendered and applied with server-side apply: every object accepted, RBAC per component, leader election.
manifests-check: binaries
	$(GO) test -count=1 ./test/manifests/

# The real-node tests (test/realnode, and test/e2e's TestRealNode*): containerd, runc and a kubelet
# built like the control plane; lifeboat's images imported, manifests/ applied; the kubelet's soft
# eviction of a VM pod. make test runs them too; this runs only them. See docs/e2e.md.
e2e: binaries
	$(GO) test -count=1 -timeout 30m ./test/realnode/
	$(GO) test -count=1 -timeout 30m -v ./test/stockcluster/
	$(GO) test -count=1 -timeout 30m -v -run '^TestRealNode' ./test/e2e/

$(CLUSTER): $(shell find test api -name '*.go') go.mod | deps
	$(GO) build -o $@ ./test/cmd/lifeboat-cluster

# lifeboat's own commands, for the demo (the tests build their own).
lifeboat-bins: deps
	$(GO) build -o bin/ ./cmd/...

ACCELERATION ?= auto
KUBECTL = "$$($(CLUSTER) bin-dir)/kubectl" --kubeconfig $(DEMO_DIR)/admin.kubeconfig

demo: deps $(CLUSTER) lifeboat-bins
	@$(CLUSTER) down --dir $(DEMO_DIR) >/dev/null
	$(CLUSTER) up --dir $(DEMO_DIR) --nodes 2 --nodes-root $(DEMO_NODES) --lifeboat-bin bin --acceleration $(ACCELERATION)
	@set -ex; \
	$(KUBECTL) apply --server-side -f manifests/lifeboatconfig.yaml -f manifests/vmi-node-paths.yaml -f manifests/evacuation-annotations.yaml; \
	: "A bandwidth cap, so that the transfer is slow enough to watch"; \
	$(KUBECTL) patch lifeboatconfig cluster --type merge -p '{"spec":{"migrations":{"bandwidthPerMigration":"32Mi"}}}'; \
	: "The VM names no node path: its kernel and its disk come from images the nodes pull, its configuration from cloud-init"; \
	: "It is on the pod network behind a Service, which follows it wherever it runs"; \
	: "A VirtualMachine: its controller runs the VM's instance, the VMI demo, by its run strategy"; \
	$(KUBECTL) apply --server-side -f manifests/examples/vm.yaml -f manifests/examples/vmi-service.yaml; \
	$(KUBECTL) get nodes -L lifeboat.dev/kvm; \
	$(KUBECTL) wait vm/demo --for=jsonpath='{.status.printableStatus}'=Running --timeout=5m; \
	$(KUBECTL) get vm,vmi,pods,svc -o wide; \
	$(CLUSTER) console default/demo --dir $(DEMO_DIR) --wait-for "lifeboat-guest disk vda: journal 1..5 intact" --timeout 3m | grep -E "lifeboat-guest (user-data|disk|network|counter [1-5]$$)"; \
	$(KUBECTL) wait pod -l lifeboat.dev/vmi-name=demo --field-selector=status.phase=Running --for=condition=Ready --timeout=1m; \
	$(CLUSTER) ask default/demo --dir $(DEMO_DIR); \
	: "The VM's node runs short of memory: its kubelet evicts the VM's pod (SIGTERM, 45 s grace)."; \
	: "A client asks the VM's Service every 20 ms meanwhile"; \
	$(CLUSTER) ask default/demo --dir $(DEMO_DIR) --every 20ms & asker=$$!; \
	trap 'kill $$asker 2>/dev/null || true' EXIT; \
	: "The harness watches the guest's console on the nodes' disks meanwhile, which no kubectl can read"; \
	$(CLUSTER) follow default/demo --dir $(DEMO_DIR) --timeout 2m --nodes-only >$(DEMO_DIR)/nodes-follow.txt 2>&1 & nodes=$$!; \
	$(CLUSTER) evict default/demo --dir $(DEMO_DIR); \
	: "The migration as a user follows it: kubectl lifeboat follow (kubectl lifeboat migrate demo --wait makes one and follows it)"; \
	KUBECONFIG=$(DEMO_DIR)/admin.kubeconfig PATH="$(CURDIR)/bin:$$($(CLUSTER) bin-dir):$$PATH" kubectl lifeboat follow demo --timeout 2m; \
	: "What the nodes show: the guest's counter goes on, the source launcher ends by itself"; \
	wait $$nodes || { cat $(DEMO_DIR)/nodes-follow.txt; exit 1; }; cat $(DEMO_DIR)/nodes-follow.txt; \
	$(KUBECTL) wait pod -l lifeboat.dev/vmi-name=demo --field-selector=status.phase=Running --for=condition=Ready --timeout=1m; \
	kill -INT $$asker; wait $$asker; \
	$(KUBECTL) get vmi,vmim,pods -o wide; \
	: "An admin drains the node the VM runs on now: the eviction webhook answers 429 and lifeboat moves the VM"; \
	node=$$($(KUBECTL) get vmi demo -o jsonpath='{.status.nodeName}'); \
	$(KUBECTL) drain "$$node" --ignore-daemonsets --delete-emptydir-data --timeout=3m; \
	$(KUBECTL) uncordon "$$node"; \
	$(KUBECTL) get vm,vmi,vmim,pods -o wide; \
	: "The VM's story, as the kubectl plugin (bin/kubectl-lifeboat) tells it"; \
	KUBECONFIG=$(DEMO_DIR)/admin.kubeconfig PATH="$(CURDIR)/bin:$$($(CLUSTER) bin-dir):$$PATH" kubectl lifeboat status demo; \
	$(KUBECTL) get events --sort-by=.lastTimestamp | tail -n 25
	@echo
	@echo "The cluster keeps running: 2 emulated nodes with lifeboat agents, the lifeboat controller (eviction webhook,"
	@echo "disruption budgets, EvictionRequest responder), the demo VM."
	@echo "  export KUBECONFIG=$(DEMO_DIR)/admin.kubeconfig PATH=$(CURDIR)/bin:$$($(CLUSTER) bin-dir):\$$PATH"
	@echo "  $(CLUSTER) evict default/demo --dir $(DEMO_DIR) && kubectl lifeboat follow demo   # again"
	@echo "  kubectl lifeboat migrate demo --wait   # move it yourself, and watch it go"
	@echo "  kubectl get vm,vmi,pods -o wide; kubectl lifeboat status demo"
	@echo "  kubectl lifeboat check   # what protects the VMs here, a line per check"
	@echo "  kubectl lifeboat console demo   # the guest's serial console (Ctrl+] leaves)"
	@echo "  kubectl logs -l lifeboat.dev/vmi-name=demo --prefix --tail=20   # its launchers' logs (kubectl logs -f POD follows one)"
	@echo "  kubectl exec \$$(kubectl get pods -l lifeboat.dev/vmi-name=demo --field-selector=status.phase=Running -o name) -- id   # a command in its launcher's container"
	@echo "  $(CLUSTER) ask default/demo --dir $(DEMO_DIR)   # the guest's answer through its Service"
	@echo "  kubectl drain NODE --ignore-daemonsets --delete-emptydir-data && kubectl uncordon NODE   # a drain live-migrates the VM too"
	@echo "  kubectl delete vmi demo   # shuts the guest down through ACPI"
	@echo "Logs: $(DEMO_DIR)/*.log.   Stop everything: make demo-down"

demo-down: $(CLUSTER)
	$(CLUSTER) down --dir $(DEMO_DIR)

clean:
	rm -rf bin .demo .images
