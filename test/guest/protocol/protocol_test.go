package protocol

import (
	"slices"
	"testing"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{in: "0", want: 0},
		{in: "4096", want: 4096},
		{in: "64K", want: 64 << 10},
		{in: "64M", want: 64 << 20},
		{in: "64m", want: 64 << 20},
		{in: "1G", want: 1 << 30},
		{in: "", wantErr: true},
		{in: "M", wantErr: true},
		{in: "-1M", wantErr: true},
		{in: "12T", wantErr: true},
		{in: "9223372036854775807G", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseSize(%q) error = %v, want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if got != tt.want {
			t.Errorf("ParseSize(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

func TestLastCounter(t *testing.T) {
	tests := []struct {
		name    string
		console string
		want    int
		wantOK  bool
	}{
		{name: "none", console: "lifeboat-guest ready\n", wantOK: false},
		{name: "highest", console: Counter(1) + "\r\n" + Counter(2) + "\r\n" + Counter(3) + "\r\n", want: 3, wantOK: true},
		{name: "partial last line", console: Counter(9) + "\n" + CounterPrefix, want: 9, wantOK: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := LastCounter(tt.console)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("LastCounter() = %d, %v, want %d, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestLastJournal(t *testing.T) {
	console := Journal("vda", 5) + "\n" + Counter(6) + "\r\n" + Journal("vdb", 20) + "\n" + Journal("vda", 10) + "\r\n"
	if n, ok := LastJournal(console, "vda"); !ok || n != 10 {
		t.Errorf("LastJournal(vda) = %d, %v; want 10", n, ok)
	}
	if _, ok := LastJournal(Counter(3), "vda"); ok {
		t.Error("a console without journal lines has none")
	}
}

func TestLastDiskPass(t *testing.T) {
	console := DiskPass("vda", 1, 100) + "\n" + Counter(6) + "\r\n" + DiskPass("vdb", 7, 5) + "\n" + DiskPass("vda", 3, 300) + "\r\n" + Journal("vda", 10) + "\n"
	if n, ok := LastDiskPass(console, "vda"); !ok || n != 3 {
		t.Errorf("LastDiskPass(vda) = %d, %v; want 3", n, ok)
	}
	if passes, rates := DiskPasses(console, "vda"); !slices.Equal(passes, []int{1, 3}) || !slices.Equal(rates, []int64{100, 300}) {
		t.Errorf("DiskPasses(vda) = %v, %v; want [1 3], [100 300]", passes, rates)
	}
	if _, ok := LastDiskPass(Journal("vda", 5), "vda"); ok {
		t.Error("a console without pass lines has none")
	}
}
