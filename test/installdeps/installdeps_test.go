// Package installdeps tests hack/install-deps, the script make demo, make test and .ci/run
// call first: a second run changes nothing, and a run that cannot install says what is missing
// and how to install it.
package installdeps

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

func script(t *testing.T) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "hack", "install-deps")
}

// run runs the script with args and returns its output and exit code.
func run(t *testing.T, cmd *exec.Cmd) (string, int) {
	t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), ee.ExitCode()
	}
	if err != nil {
		t.Fatalf("running %s: %v", cmd, err)
	}
	return out.String(), 0
}

// machineState is what an install could change: packages and their versions, apt's sources and
// lists, and the libvirt-qemu account.
func machineState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, argv := range [][]string{
		{"dpkg-query", "-W", "-f", "${Package} ${Version} ${Status}\n"},
		{"ls", "-l", "--time-style=full-iso", "/etc/apt/sources.list.d", "/var/lib/apt/lists"},
		{"stat", "-c", "%n %y", "/var/lib/dpkg/status"},
		{"getent", "passwd", "libvirt-qemu"},
		{"getent", "group", "libvirt-qemu"},
	} {
		out, err := exec.Command(argv[0], argv[1:]...).Output()
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(argv, " "), err)
		}
		b.Write(out)
	}
	return b.String()
}

func TestASecondRunChangesNothing(t *testing.T) {
	s := script(t)
	if out, code := run(t, exec.Command(s)); code != 0 {
		t.Fatalf("the first run exited %d:\n%s", code, out)
	}
	before := machineState(t)
	start := time.Now()
	out, code := run(t, exec.Command(s))
	took := time.Since(start)
	if code != 0 || out != "" {
		t.Errorf("a run with everything installed exited %d and printed %q; want 0 and nothing", code, out)
	}
	if after := machineState(t); after != before {
		t.Errorf("a run with everything installed changed the machine:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if out, code := run(t, exec.Command(s, "--check")); code != 0 || out != "" {
		t.Errorf("--check with everything installed exited %d and printed %q; want 0 and nothing", code, out)
	}
	t.Logf("the second run took %s", took)
}

// fakeTools puts scripts named for commands ahead of PATH: dpkg-query that reports libvirt-dev
// missing (and asks the real one for the rest), and any others given.
func fakeTools(t *testing.T, others map[string]string) []string {
	t.Helper()
	dir, err := os.MkdirTemp("", "install-deps-fake-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// Readable by the unprivileged user the script may run as.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tools := map[string]string{"dpkg-query": `for a in "$@"; do [ "$a" = libvirt-dev ] && exit 1; done; exec /usr/bin/dpkg-query "$@"`}
	for name, body := range others {
		tools[name] = body
	}
	for name, body := range tools {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return []string{"PATH=" + dir + ":/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + dir}
}

// oneMessage checks that out is one line naming the missing package and the command to run.
func oneMessage(t *testing.T, out string, code int, command string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 1 || len(lines) != 1 {
		t.Fatalf("exit %d with %d lines, want 1 and one line; it printed:\n%s", code, len(lines), out)
	}
	if !strings.Contains(out, "libvirt-dev") || !strings.Contains(out, command) {
		t.Errorf("the message should name libvirt-dev and the command %q; it said:\n%s", command, out)
	}
}

func TestWithoutRootItSaysWhatIsMissingAndTheCommand(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("running the script as the user nobody needs root (the README's prerequisites)")
	}
	s := script(t)
	cmd := exec.Command(s)
	cmd.Env = fakeTools(t, map[string]string{"sudo": "exit 1"}) // a sudo that refuses, as for a user without rights
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, code := run(t, cmd)
	oneMessage(t, out, code, "sudo "+s)
}

func TestCheckOnlyInstallsNothingAndSaysTheCommand(t *testing.T) {
	s := script(t)
	cmd := exec.Command(s, "--check")
	cmd.Env = fakeTools(t, map[string]string{"apt-get": `echo "apt-get must not run" >&2; exit 1`})
	out, code := run(t, cmd)
	oneMessage(t, out, code, "sudo "+s)
}

func TestWithoutTheMirrorsItSaysWhatIsMissingAndTheCommand(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("the script reaches apt-get only as root (the README's prerequisites)")
	}
	s := script(t)
	cmd := exec.Command(s)
	// apt-get failing as it does when the mirrors cannot be reached.
	cmd.Env = fakeTools(t, map[string]string{"apt-get": `echo "E: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease  Could not resolve 'deb.debian.org'" >&2; exit 100`})
	out, code := run(t, cmd)
	// After its progress line, the script's message comes first; apt-get's own words follow it.
	out = strings.TrimPrefix(out, "install-deps: refreshing apt package lists\n")
	first, _, _ := strings.Cut(out, "\n")
	oneMessage(t, first, code, s)
	if !strings.Contains(first, "mirrors") || !strings.Contains(out, "Could not resolve") {
		t.Errorf("the message should say the mirrors could not be reached, then what apt-get said; it said:\n%s", out)
	}
}
