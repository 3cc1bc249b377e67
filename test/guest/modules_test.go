package guest

import (
	"fmt"
	"slices"
	"testing"
)

func TestLoadOrder(t *testing.T) {
	tests := []struct {
		name     string
		want     []string
		deps     map[string][]string
		builtins []string
		order    []string
		wantErr  bool
	}{
		{
			name:  "no dependencies",
			want:  []string{"button", "evdev"},
			deps:  map[string][]string{"button": nil, "evdev": nil},
			order: []string{"button", "evdev"},
		},
		{
			name:  "dependencies first, each once",
			want:  []string{"a", "b"},
			deps:  map[string][]string{"a": {"c", "d"}, "b": {"d"}, "c": {"d"}, "d": nil},
			order: []string{"d", "c", "a", "b"},
		},
		{
			name:     "built-in modules are not loaded",
			want:     []string{"button", "evdev"},
			deps:     map[string][]string{"evdev": nil},
			builtins: []string{"button"},
			order:    []string{"evdev"},
		},
		{
			name:    "missing module",
			want:    []string{"nope"},
			deps:    map[string][]string{},
			wantErr: true,
		},
		{
			name:    "cycle",
			want:    []string{"a"},
			deps:    map[string][]string{"a": {"b"}, "b": {"a"}},
			wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			builtin := func(name string) bool { return slices.Contains(tt.builtins, name) }
			depends := func(name string) ([]string, error) {
				d, ok := tt.deps[name]
				if !ok {
					return nil, fmt.Errorf("no module %s", name)
				}
				return d, nil
			}
			got, err := loadOrder(tt.want, builtin, depends)
			if (err != nil) != tt.wantErr {
				t.Fatalf("loadOrder() error = %v, want error %v", err, tt.wantErr)
			}
			if !slices.Equal(got, tt.order) {
				t.Errorf("loadOrder() = %v, want %v", got, tt.order)
			}
		})
	}
}

func TestModinfoDepends(t *testing.T) {
	tests := []struct {
		name    string
		modinfo string
		want    []string
	}{
		{name: "none", modinfo: "license=GPL\x00depends=\x00intree=Y\x00", want: nil},
		{name: "two", modinfo: "license=GPL\x00depends=ff_memless,hid\x00", want: []string{"ff_memless", "hid"}},
		{name: "no entry", modinfo: "license=GPL\x00", want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := modinfoDepends([]byte(tt.modinfo)); !slices.Equal(got, tt.want) {
				t.Errorf("modinfoDepends() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestModuleName(t *testing.T) {
	for path, want := range map[string]string{
		"kernel/drivers/acpi/button.ko":        "button",
		"/x/kernel/drivers/hid/hid-generic.ko": "hid_generic",
	} {
		if got := moduleName(path); got != want {
			t.Errorf("moduleName(%q) = %q, want %q", path, got, want)
		}
	}
}
