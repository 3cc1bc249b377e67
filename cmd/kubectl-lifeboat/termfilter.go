package main

import (
	"io"
	"unicode/utf8"
)

// termFilter passes a guest's console output to the operator's terminal without the escape
// sequences a hostile guest could use against that terminal rather than draw with (issue 45,
// N18): OSC (window titles, OSC 52's clipboard writes, hyperlinks, colour and font changes), DCS,
// SOS, PM and APC strings, with their contents, and CSI's window operations (final byte t:
// resizing, iconifying, reporting the title). What a console draws with stays: text in UTF-8,
// the C0 controls a terminal lays text out with, and the rest of CSI (cursor moves, colours,
// erasing, modes), so login prompts, colours and full-screen programs still look right. C1
// controls (U+0080 to U+009F, which some terminals obey like their ESC forms) never pass: those
// that open a string are dropped with it. `kubectl lifeboat console --raw` turns it off.
type termFilter struct {
	w     io.Writer
	state filterState
	// seq holds the escape sequence being read, passed on only once it is known to be harmless.
	seq []byte
	// partial holds the first bytes of a UTF-8 character split across writes.
	partial []byte
	out     []byte
}

type filterState int

const (
	ground        filterState = iota
	escape                    // after ESC
	csi                       // in ESC [ ... up to its final byte
	csiDropped                // in a CSI sequence too long to hold back, dropped up to its final byte
	stringCommand             // in an OSC, DCS, SOS, PM or APC string, dropped up to its terminator
	stringEscape              // ESC inside such a string: ST (ESC \) ends it
)

// maxCSI bounds a CSI sequence held back: real ones are a few bytes; a longer one is dropped.
const maxCSI = 64

func newTermFilter(w io.Writer) *termFilter { return &termFilter{w: w} }

func (f *termFilter) Write(p []byte) (int, error) {
	f.out = f.out[:0]
	data := p
	if len(f.partial) > 0 {
		data = append(f.partial, p...)
		f.partial = nil
	}
	for len(data) > 0 {
		r, size := utf8.DecodeRune(data)
		if r == utf8.RuneError && size <= 1 && !utf8.FullRune(data) {
			f.partial = append([]byte(nil), data...) // the rest of the character comes in the next write
			break
		}
		f.step(r, data[:size])
		data = data[size:]
	}
	if _, err := f.w.Write(f.out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// step takes one character (or one byte that is not valid UTF-8, r being utf8.RuneError).
func (f *termFilter) step(r rune, raw []byte) {
	const esc = 0x1b
	switch f.state {
	case ground:
		switch {
		case r == esc:
			f.state, f.seq = escape, append(f.seq[:0], esc)
		case isStringOpenerC1(r):
			f.state = stringCommand
		case r < 0x20:
			if r == '\a' || r == '\b' || r == '\t' || r == '\n' || r == '\v' || r == '\f' || r == '\r' {
				f.out = append(f.out, byte(r))
			}
		case r >= 0x80 && r <= 0x9f:
			// Any other C1 control: dropped.
		case r == utf8.RuneError && len(raw) == 1 && raw[0] >= 0x80 && raw[0] <= 0x9f:
			// A lone byte a terminal not in UTF-8 would take for a C1 control.
		default:
			f.out = append(f.out, raw...)
		}
	case escape:
		switch r {
		case '[':
			f.state, f.seq = csi, append(f.seq, '[')
		case ']', 'P', 'X', '^', '_':
			f.state = stringCommand
		case esc:
			// ESC ESC: the first one comes to nothing.
		default:
			// Two- and three-byte sequences (ESC 7, ESC c, ESC ( B): ESC passes, and what
			// follows is read as text, which it is as harmless as.
			f.out = append(f.out, esc)
			f.state = ground
			f.step(r, raw)
		}
	case csi:
		switch {
		case r >= 0x40 && r <= 0x7e: // the final byte
			if r != 't' {
				f.out = append(append(f.out, f.seq...), byte(r))
			}
			f.state = ground
		case r >= 0x20 && r <= 0x3f && len(f.seq) < maxCSI: // parameters and intermediates
			f.seq = append(f.seq, byte(r))
		case r >= 0x20 && r <= 0x3f:
			f.state = csiDropped
		case r == esc:
			f.state, f.seq = escape, append(f.seq[:0], esc)
		default: // CAN or SUB abandon the sequence; anything else makes it no CSI: dropped
			f.state = ground
		}
	case csiDropped:
		switch {
		case r >= 0x20 && r <= 0x3f:
		case r == esc:
			f.state, f.seq = escape, append(f.seq[:0], esc)
		default:
			f.state = ground
		}
	case stringCommand:
		switch {
		case r == '\a' || r == 0x9c || r == 0x18 || r == 0x1a: // BEL (OSC's), ST, CAN, SUB end it
			f.state = ground
		case r == esc:
			f.state = stringEscape
		}
	case stringEscape:
		if r == '\\' {
			f.state = ground
		} else if r != esc {
			f.state = stringCommand
		}
	}
}

// isStringOpenerC1 is the C1 form of DCS, SOS, OSC, PM or APC.
func isStringOpenerC1(r rune) bool {
	return r == 0x90 || r == 0x98 || r == 0x9d || r == 0x9e || r == 0x9f
}
