package monitoring

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
	"go.yaml.in/yaml/v3"
)

const ruleFile = "../../manifests/monitoring/prometheusrule.yaml"

// promQL parses as Prometheus does by default: no experimental syntax.
var promQL = parser.NewParser(parser.Options{})

// ruleGroups reads the PrometheusRule and writes its spec as a Prometheus rule file, which is
// what the Prometheus operator hands Prometheus; it returns that file's path and its rules.
func ruleGroups(t *testing.T) (string, []rulefmt.Rule) {
	t.Helper()
	data, err := os.ReadFile(ruleFile)
	if err != nil {
		t.Fatal(err)
	}
	var object struct {
		APIVersion string    `yaml:"apiVersion"`
		Kind       string    `yaml:"kind"`
		Spec       yaml.Node `yaml:"spec"`
	}
	if err := yaml.Unmarshal(data, &object); err != nil {
		t.Fatal(err)
	}
	if object.APIVersion != "monitoring.coreos.com/v1" || object.Kind != "PrometheusRule" {
		t.Fatalf("%s is a %s %s, want a monitoring.coreos.com/v1 PrometheusRule", ruleFile, object.APIVersion, object.Kind)
	}
	spec, err := yaml.Marshal(&object.Spec)
	if err != nil {
		t.Fatal(err)
	}
	// Unknown fields refused, templates and expressions checked, as Prometheus loads a rule file.
	groups, errs := rulefmt.Parse(spec, false, model.UTF8Validation, promQL, promslog.NewNopLogger())
	if len(errs) > 0 {
		t.Fatalf("%s: %v", ruleFile, errs)
	}
	path := filepath.Join(t.TempDir(), "lifeboat.rules.yaml")
	if err := os.WriteFile(path, spec, 0o600); err != nil {
		t.Fatal(err)
	}
	var all []rulefmt.Rule
	for _, g := range groups.Groups {
		all = append(all, g.Rules...)
	}
	return path, all
}

// queried checks that expr parses and selects only registered metrics by labels they carry
// (and `up` of job lifeboat-agent); it returns the metric names it selects.
func queried(t *testing.T, registered map[string]metric, expr string) []string {
	t.Helper()
	parsed, err := promQL.ParseExpr(expr)
	if err != nil {
		t.Errorf("%q does not parse: %v", expr, err)
		return nil
	}
	var names []string
	parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		m, ok := lookup(registered, name)
		switch {
		case name == "up":
			m, ok = metric{labels: map[string]bool{"instance": true, "job": true}}, true
		case !ok:
			t.Errorf("%q selects %q, which no lifeboat component registers", expr, name)
			return nil
		}
		names = append(names, name)
		for _, matcher := range vs.LabelMatchers {
			if matcher.Name != model.MetricNameLabel && !m.labels[matcher.Name] {
				t.Errorf("%q selects %s by label %q, which it does not carry", expr, name, matcher.Name)
			}
		}
		return nil
	})
	return names
}

// lookup finds a metric by a series name, a histogram's by those of its buckets, sum and count.
func lookup(registered map[string]metric, name string) (metric, bool) {
	if m, ok := registered[name]; ok && !m.histogram {
		return m, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if m, ok := registered[strings.TrimSuffix(name, suffix)]; ok && m.histogram && strings.HasSuffix(name, suffix) {
			if suffix == "_bucket" {
				m.labels = withLabel(m.labels, "le")
			}
			return m, true
		}
	}
	return metric{}, false
}

func withLabel(names map[string]bool, more string) map[string]bool {
	out := map[string]bool{more: true}
	for n := range names {
		out[n] = true
	}
	return out
}

func TestTheAlertsQueryOnlyRegisteredMetrics(t *testing.T) {
	registered := registered(t)
	_, all := ruleGroups(t)
	if len(all) == 0 {
		t.Fatal("no rules")
	}
	for _, r := range all {
		if r.Alert == "" {
			t.Errorf("rule %q is not an alert", r.Record)
			continue
		}
		if len(queried(t, registered, r.Expr)) == 0 {
			t.Errorf("alert %s selects no metric", r.Alert)
		}
	}
}

// TestEachAlertHasARunbook: an alert's runbook_url points at a section of docs/operations.md
// that exists, and its summary and description say something.
func TestEachAlertHasARunbook(t *testing.T) {
	docs, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for line := range strings.Lines(string(docs)) {
		if heading, ok := strings.CutPrefix(line, "#"); ok {
			anchors[anchor(strings.TrimLeft(heading, "#"))] = true
		}
	}
	_, all := ruleGroups(t)
	for _, r := range all {
		const prefix = "https://github.com/lifeboat-vm/lifeboat/blob/main/docs/operations.md#"
		url := r.Annotations["runbook_url"]
		section, ok := strings.CutPrefix(url, prefix)
		switch {
		case !ok:
			t.Errorf("alert %s: runbook_url %q is not a section of docs/operations.md", r.Alert, url)
		case !anchors[section]:
			t.Errorf("alert %s: docs/operations.md has no section #%s", r.Alert, section)
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" || r.Labels["severity"] == "" {
			t.Errorf("alert %s: want a summary, a description and a severity", r.Alert)
		}
	}
}

// anchor is GitHub's anchor for a Markdown heading.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// alertCase is a promtool-style unit test of one alert: series loaded one sample a minute (in
// promtool's notation), the rules evaluated every minute up to at, and the alerts then firing.
type alertCase struct {
	name   string
	alert  string
	series []string
	at     time.Duration
	fires  []map[string]string // each firing alert's labels, alertname and severity aside
}

// The series are those the components emit (their names and labels are checked against the
// registries), with the target labels Prometheus adds: agents are scraped from their nodes as
// job lifeboat-agent, the two controller replicas as job lifeboat-controller.
var alertCases = []alertCase{
	{
		name:  "a node-pressure migration fails: one alert, though both replicas count it",
		alert: "LifeboatEvacuationFailed",
		series: []string{
			`lifeboat_migrations_ended_total{cause="NodePressure",phase="Failed",instance="10.244.1.7:8080",job="lifeboat-controller"} 0 0 0 1 1 1`,
			`lifeboat_migrations_ended_total{cause="NodePressure",phase="Failed",instance="10.244.2.9:8080",job="lifeboat-controller"} 0 0 0 1 1 1`,
		},
		at:    5 * time.Minute,
		fires: []map[string]string{{"cause": "NodePressure"}},
	},
	{
		name:  "migrations succeed, and a manual one fails",
		alert: "LifeboatEvacuationFailed",
		series: []string{
			`lifeboat_migrations_ended_total{cause="Drain",phase="Succeeded",instance="10.244.1.7:8080",job="lifeboat-controller"} 0 1 2 3 4 5`,
			`lifeboat_migrations_ended_total{cause="Manual",phase="Failed",instance="10.244.1.7:8080",job="lifeboat-controller"} 0 0 1 1 1 1`,
		},
		at: 5 * time.Minute,
	},
	{
		name:  "a migration still under way after its deadline",
		alert: "LifeboatEvacuationPastDeadline",
		series: []string{
			`lifeboat_migration_deadline_timestamp_seconds{namespace="vms",migration="db-x7k2q",vmi="db",cause="NodePressure",source_node="node-a",instance="10.244.1.7:8080",job="lifeboat-controller"} 600x15`,
		},
		at:    11 * time.Minute,
		fires: []map[string]string{{"namespace": "vms", "migration": "db-x7k2q", "vmi": "db", "cause": "NodePressure", "source_node": "node-a"}},
	},
	{
		name:  "a migration under way before its deadline",
		alert: "LifeboatEvacuationPastDeadline",
		series: []string{
			`lifeboat_migration_deadline_timestamp_seconds{namespace="vms",migration="db-x7k2q",vmi="db",cause="NodePressure",source_node="node-a",instance="10.244.1.7:8080",job="lifeboat-controller"} 600x15`,
		},
		at: 9 * time.Minute,
	},
	{
		name:  "a migration that ended before its deadline is no longer listed",
		alert: "LifeboatEvacuationPastDeadline",
		series: []string{
			`lifeboat_migration_deadline_timestamp_seconds{namespace="vms",migration="db-x7k2q",vmi="db",cause="NodePressure",source_node="node-a",instance="10.244.1.7:8080",job="lifeboat-controller"} 600x3 stale`,
		},
		at: 15 * time.Minute,
	},
	{
		name:   "a marked VM was still on its node at its deadline",
		alert:  "LifeboatVMLost",
		series: []string{`lifeboat_agent_evacuations_lost_total{instance="node-a",job="lifeboat-agent"} 0 0 1 1`},
		at:     3 * time.Minute,
		fires:  []map[string]string{{"instance": "node-a", "job": "lifeboat-agent"}},
	},
	{
		name:   "no VM lost",
		alert:  "LifeboatVMLost",
		series: []string{`lifeboat_agent_evacuations_lost_total{instance="node-a",job="lifeboat-agent"} 0x20`},
		at:     20 * time.Minute,
	},
	{
		name:   "VMs at risk for a quarter of an hour",
		alert:  "LifeboatNodeVMsAtRisk",
		series: []string{`lifeboat_agent_node_vms_at_risk{instance="node-a",job="lifeboat-agent"} 1x20`},
		at:     16 * time.Minute,
		fires:  []map[string]string{{"instance": "node-a", "job": "lifeboat-agent"}},
	},
	{
		name:  "VMs at risk for ten minutes (the settings are being changed), and a node whose VMs are safe",
		alert: "LifeboatNodeVMsAtRisk",
		series: []string{
			`lifeboat_agent_node_vms_at_risk{instance="node-a",job="lifeboat-agent"} 1x9 0x10`,
			`lifeboat_agent_node_vms_at_risk{instance="node-b",job="lifeboat-agent"} 0x20`,
		},
		at: 20 * time.Minute,
	},
	{
		name:   "the strict webhook refused a caller",
		alert:  "LifeboatEvictionWebhookRefusedCalls",
		series: []string{`lifeboat_eviction_webhook_unauthenticated_requests_total{instance="10.244.1.7:8080",job="lifeboat-controller"} 0 0 2 2`},
		at:     3 * time.Minute,
		fires:  []map[string]string{{"instance": "10.244.1.7:8080", "job": "lifeboat-controller"}},
	},
	{
		name:   "the strict webhook refused no one",
		alert:  "LifeboatEvictionWebhookRefusedCalls",
		series: []string{`lifeboat_eviction_webhook_unauthenticated_requests_total{instance="10.244.1.7:8080",job="lifeboat-controller"} 0x10`},
		at:     10 * time.Minute,
	},
	{
		name:   "a permissive webhook held an unauthenticated review to its bounds",
		alert:  "LifeboatEvictionWebhookUnauthenticatedReviews",
		series: []string{`lifeboat_eviction_webhook_unauthenticated_reviews_total{answer="bounded",instance="10.244.1.7:8080",job="lifeboat-controller"} 0 0 1 1`},
		at:     3 * time.Minute,
		fires:  []map[string]string{{"answer": "bounded", "instance": "10.244.1.7:8080", "job": "lifeboat-controller"}},
	},
	{
		name:  "a permissive webhook answered a drain's reviews within its bounds",
		alert: "LifeboatEvictionWebhookUnauthenticatedReviews",
		series: []string{
			`lifeboat_eviction_webhook_unauthenticated_reviews_total{answer="bounded",instance="10.244.1.7:8080",job="lifeboat-controller"} 0x5`,
			`lifeboat_eviction_webhook_unauthenticated_reviews_total{answer="evacuating",instance="10.244.1.7:8080",job="lifeboat-controller"} 0 1 2 3 4 5`,
		},
		at: 5 * time.Minute,
	},
	{
		name:   "a node's migration certificate expires in an hour",
		alert:  "LifeboatMigrationCertificateExpiring",
		series: []string{`lifeboat_agent_migration_certificate_expiry_timestamp_seconds{instance="node-a",job="lifeboat-agent"} 3600x5`},
		at:     5 * time.Minute,
		fires:  []map[string]string{{"instance": "node-a", "job": "lifeboat-agent"}},
	},
	{
		name:  "a node's migration certificate has most of its life left, another none signed yet",
		alert: "LifeboatMigrationCertificateExpiring",
		series: []string{
			`lifeboat_agent_migration_certificate_expiry_timestamp_seconds{instance="node-a",job="lifeboat-agent"} 86400x5`,
			`lifeboat_agent_migration_certificate_expiry_timestamp_seconds{instance="node-b",job="lifeboat-agent"} NaN NaN NaN NaN NaN NaN`,
		},
		at: 5 * time.Minute,
	},
	{
		name:   "the webhook's serving certificate expires in twelve hours",
		alert:  "LifeboatWebhookCertificateExpiring",
		series: []string{`lifeboat_eviction_webhook_certificate_expiry_timestamp_seconds{instance="10.244.1.7:8080",job="lifeboat-controller"} 43200x5`},
		at:     5 * time.Minute,
		fires:  []map[string]string{{"instance": "10.244.1.7:8080", "job": "lifeboat-controller"}},
	},
	{
		name:   "the webhook's serving certificate was rotated",
		alert:  "LifeboatWebhookCertificateExpiring",
		series: []string{`lifeboat_eviction_webhook_certificate_expiry_timestamp_seconds{instance="10.244.1.7:8080",job="lifeboat-controller"} 43200 43200 604800x5`},
		at:     5 * time.Minute,
	},
	{
		name:   "an agent has not answered its scrapes for five minutes",
		alert:  "LifeboatAgentDown",
		series: []string{`up{instance="node-a",job="lifeboat-agent"} 1 0x10`},
		at:     7 * time.Minute,
		fires:  []map[string]string{{"instance": "node-a", "job": "lifeboat-agent"}},
	},
	{
		name:  "an agent missed a few scrapes, and a controller replica is down",
		alert: "LifeboatAgentDown",
		series: []string{
			`up{instance="node-a",job="lifeboat-agent"} 1 0 0 0 1x5`,
			`up{instance="10.244.1.7:8080",job="lifeboat-controller"} 0x10`,
		},
		at: 8 * time.Minute,
	},
}

// TestTheAlertsFireWhenTheyShould runs alertCases as promtool test rules would, on the rules of
// the PrometheusRule, and checks that each alert has a case where it fires and one where it
// does not.
func TestTheAlertsFireWhenTheyShould(t *testing.T) {
	registered := registered(t)
	path, all := ruleGroups(t)
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range alertCases {
		t.Run(tc.alert+": "+tc.name, func(t *testing.T) {
			for _, s := range tc.series {
				name, _, _ := strings.Cut(s, " ")
				queried(t, registered, name)
			}
			got := firing(t, path, tc.series, tc.at, tc.alert)
			var want []labels.Labels
			for _, l := range tc.fires {
				b := labels.NewBuilder(labels.FromMap(l))
				b.Set(labels.AlertName, tc.alert)
				b.Set("severity", severity(all, tc.alert))
				want = append(want, b.Labels())
			}
			if !slices.EqualFunc(got, want, labels.Equal) {
				t.Errorf("at %s firing %v, want %v", tc.at, got, want)
			}
		})
		if len(tc.fires) > 0 {
			fires[tc.alert] = true
		} else {
			quiet[tc.alert] = true
		}
	}
	for _, r := range all {
		if !fires[r.Alert] || !quiet[r.Alert] {
			t.Errorf("alert %s: want a case where it fires (%t) and one where it does not (%t)", r.Alert, fires[r.Alert], quiet[r.Alert])
		}
	}
}

func severity(all []rulefmt.Rule, alert string) string {
	for _, r := range all {
		if r.Alert == alert {
			return r.Labels["severity"]
		}
	}
	return ""
}

// firing evaluates the rule file every minute from time 0 to at, as promtool does, and returns
// the labels of the alert's firing instances, sorted.
func firing(t *testing.T, ruleFile string, series []string, at time.Duration, alert string) []labels.Labels {
	t.Helper()
	suite, err := promqltest.NewLazyLoader("load 1m\n  "+strings.Join(series, "\n  "),
		promqltest.LazyLoaderOpts{EnableAtModifier: true, EnableNegativeOffset: true, Parser: promQL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = suite.Close() })
	ctx := context.Background()
	manager := rules.NewManager(&rules.ManagerOptions{
		QueryFunc:    rules.EngineQueryFunc(suite.QueryEngine(), suite.Storage()),
		AppendableV2: suite.Storage(),
		Context:      ctx,
		NotifyFunc:   func(context.Context, string, ...*rules.Alert) {},
		Logger:       promslog.NewNopLogger(),
		Parser:       promQL,
	})
	groups, errs := manager.LoadGroups(time.Minute, labels.EmptyLabels(), "", nil, false, ruleFile)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	var evalErr error
	start := time.Unix(0, 0).UTC()
	for ts := start; !ts.After(start.Add(at)); ts = ts.Add(time.Minute) {
		suite.WithSamplesTill(ts, func(err error) {
			if err != nil {
				evalErr = err
				return
			}
			for _, g := range groups {
				g.Eval(ctx, ts)
				for _, r := range g.Rules() {
					if r.LastError() != nil {
						evalErr = fmt.Errorf("rule %s at %s: %w", r.Name(), ts.Sub(start), r.LastError())
					}
				}
			}
		})
		if evalErr != nil {
			t.Fatal(evalErr)
		}
	}
	var got []labels.Labels
	for _, g := range groups {
		for _, r := range g.AlertingRules() {
			if r.Name() != alert {
				continue
			}
			for _, a := range r.ActiveAlerts() {
				if a.State == rules.StateFiring {
					got = append(got, a.Labels)
				}
			}
		}
	}
	slices.SortFunc(got, labels.Compare)
	return got
}
