package node

import "strings"

// expand replaces $(NAME) references in s with the values lookup finds, as Kubernetes expands
// env values, commands and args: $$ is a literal $, and references to unknown names, or that
// are never closed, stay as written.
func expand(s string, lookup func(string) (string, bool)) string {
	var b strings.Builder
	checkpoint := 0
	for i := 0; i < len(s)-1; i++ {
		if s[i] != '$' {
			continue
		}
		b.WriteString(s[checkpoint:i])
		switch next := s[i+1]; next {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				// Unclosed: keep "$(" and read on after it.
				b.WriteString("$(")
				i++
				break
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			i += 2 + end
		default:
			b.WriteByte('$')
			b.WriteByte(next)
			i++
		}
		checkpoint = i + 1
	}
	return b.String() + s[checkpoint:]
}
