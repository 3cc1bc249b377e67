package guest

import "testing"

func TestKernelPackage(t *testing.T) {
	tests := []struct {
		name    string
		output  string
		want    string
		wantErr bool
	}{
		{
			name:   "debian 12",
			output: "linux-image-cloud-amd64\n  Depends: linux-image-6.1.0-56-cloud-amd64\n",
			want:   "linux-image-6.1.0-56-cloud-amd64",
		},
		{
			name:   "virtual and unrelated dependencies are skipped",
			output: "linux-image-cloud-amd64\n  Depends: <linux-image>\n  Recommends: firmware\n  Depends: linux-image-6.1.0-57-cloud-amd64\n",
			want:   "linux-image-6.1.0-57-cloud-amd64",
		},
		{name: "no lists", output: "", wantErr: true},
		{name: "no kernel dependency", output: "linux-image-cloud-amd64\n  Depends: something-else\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := kernelPackage(tt.output)
			if (err != nil) != tt.wantErr {
				t.Fatalf("kernelPackage() error = %v, want error %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("kernelPackage() = %q, want %q", got, tt.want)
			}
		})
	}
}
