package controlplane

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

// GoBuild is one run of `go build`: every binary the tests build (lifeboat's commands, the
// images' binaries, the guest's /init, the cached Kubernetes components) is built through it.
type GoBuild struct {
	// Dir is where the go command runs, inside the module that holds Packages; empty means
	// this checkout's root.
	Dir string
	// Out is a file for one package, or a directory ending in a path separator for several.
	Out      string
	Packages []string
	// Release builds without paths and symbols (-trimpath, -ldflags "-s -w"), for images and
	// cached binaries; LDFlags are added to those.
	Release bool
	LDFlags string
	Tags    string
	// Env is added to the go command's environment (CGO_ENABLED=0, say).
	Env []string
	// Output receives the go command's output; nil keeps it for the error.
	Output io.Writer
}

// Run builds.
func (g GoBuild) Run(ctx context.Context) error {
	args := []string{"build", "-buildvcs=false"}
	if g.Release {
		args = append(args, "-trimpath", "-ldflags", strings.TrimSpace("-s -w "+g.LDFlags))
	}
	if g.Tags != "" {
		args = append(args, "-tags", g.Tags)
	}
	cmd := exec.CommandContext(ctx, "go", append(append(args, "-o", g.Out), g.Packages...)...)
	cmd.Dir = g.Dir
	if cmd.Dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return err
		}
		cmd.Dir = root
	}
	cmd.Env = append(os.Environ(), g.Env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if g.Output != nil {
		cmd.Stdout, cmd.Stderr = g.Output, g.Output
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building %s in %s: %w\n%s", strings.Join(g.Packages, " "), cmd.Dir, err, out.Bytes())
	}
	return nil
}
