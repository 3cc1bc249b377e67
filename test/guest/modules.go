package guest

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// moduleTree is the kernel modules of an unpacked kernel package, by module name.
type moduleTree struct {
	files    map[string]string // module name → path of its .ko
	builtins map[string]bool   // modules built into the kernel image
}

// indexModules reads a lib/modules/<version> tree. The package ships no modules.dep
// (depmod writes it on install), so dependencies come from each module's .modinfo.
func indexModules(tree string) (moduleTree, error) {
	t := moduleTree{files: map[string]string{}, builtins: map[string]bool{}}
	err := filepath.WalkDir(filepath.Join(tree, "kernel"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".ko") {
			t.files[moduleName(path)] = path
		}
		return nil
	})
	if err != nil {
		return moduleTree{}, fmt.Errorf("indexing the kernel's modules: %w", err)
	}
	builtin, err := os.ReadFile(filepath.Join(tree, "modules.builtin"))
	if err != nil {
		return moduleTree{}, fmt.Errorf("reading the kernel's built-in modules: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(builtin))
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			t.builtins[moduleName(line)] = true
		}
	}
	return t, nil
}

// moduleName is the kernel's name for a module file: kernel/drivers/acpi/button.ko → button.
// The kernel treats - and _ in module names alike; depends= uses _.
func moduleName(path string) string {
	return strings.ReplaceAll(strings.TrimSuffix(filepath.Base(path), ".ko"), "-", "_")
}

func (t moduleTree) builtin(name string) bool { return t.builtins[name] }

// depends reads the module's dependencies from the depends= entry of its .modinfo section.
func (t moduleTree) depends(name string) ([]string, error) {
	path, ok := t.files[name]
	if !ok {
		return nil, fmt.Errorf("the kernel has no module %s, built in or loadable", name)
	}
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading module %s: %w", name, err)
	}
	defer f.Close()
	section := f.Section(".modinfo")
	if section == nil {
		return nil, fmt.Errorf("module %s has no .modinfo section", name)
	}
	info, err := section.Data()
	if err != nil {
		return nil, fmt.Errorf("reading the .modinfo of module %s: %w", name, err)
	}
	return modinfoDepends(info), nil
}

// modinfoDepends parses the depends= entry of a .modinfo section (NUL-separated key=value pairs).
func modinfoDepends(modinfo []byte) []string {
	for _, entry := range bytes.Split(modinfo, []byte{0}) {
		if list, ok := bytes.CutPrefix(entry, []byte("depends=")); ok {
			var deps []string
			for _, d := range strings.Split(string(list), ",") {
				if d != "" {
					deps = append(deps, d)
				}
			}
			return deps
		}
	}
	return nil
}

// loadOrder lists the modules to load for want, each after its dependencies and each
// once, leaving out the built-in ones.
func loadOrder(want []string, builtin func(string) bool, depends func(string) ([]string, error)) ([]string, error) {
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	var order []string
	var visit func(name string, path []string) error
	visit = func(name string, path []string) error {
		switch {
		case state[name] == done || builtin(name):
			return nil
		case state[name] == visiting:
			return fmt.Errorf("kernel modules depend on each other in a cycle: %s", strings.Join(append(path, name), " → "))
		}
		state[name] = visiting
		deps, err := depends(name)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d, append(path, name)); err != nil {
				return err
			}
		}
		state[name] = done
		order = append(order, name)
		return nil
	}
	for _, name := range want {
		if err := visit(name, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}
