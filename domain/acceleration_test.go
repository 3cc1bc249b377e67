package domain

import "testing"

func TestParseAcceleration(t *testing.T) {
	tests := []struct {
		in      string
		want    Acceleration
		wantErr bool
	}{
		{"kvm", KVM, false},
		{"tcg", TCG, false},
		{"auto", Auto, false},
		{"KVM", "", true},
		{"", "", true},
	}
	for _, tt := range tests {
		got, err := ParseAcceleration(tt.in)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("ParseAcceleration(%q) = %q, %v, want %q, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestDomainType(t *testing.T) {
	tests := []struct {
		a       Acceleration
		want    string
		wantErr bool
	}{
		{KVM, "kvm", false},
		{TCG, "qemu", false},
		{Auto, "", true},
		{"", "", true},
	}
	for _, tt := range tests {
		got, err := domainType(tt.a)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("domainType(%q) = %q, %v, want %q, error %v", tt.a, got, err, tt.want, tt.wantErr)
		}
	}
}
