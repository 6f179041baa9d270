package zayactl

import (
	"encoding/xml"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// What the plugin prints was mostly written by others: a worker's termination message, an API
// server's refusal quoting a template, a status that a job's manager or any tenant with the
// status subresource wrote. Printed raw, it reaches a platform admin's terminal with its
// control sequences (a clipboard write, a window title, a screen clear) and its own lines laid
// out like the plugin's (a forged "root:" naming another tenant's node). shown makes such a
// value inert and one line; the plugin's own words and colours are not passed through it.

// shown is s for a terminal: one line (a line break is shown as ⏎), every control or format
// character (C0 and C1 controls, DEL, bidirectional overrides, zero-width characters) and every
// byte that is not UTF-8 written out as an escape, so that nothing in s acts on the terminal or
// looks like another line of the report.
func shown(s string) string {
	if isPlain(s) {
		return s
	}
	var b strings.Builder
	for i, w := 0, 0; i < len(s); i += w {
		r, size := utf8.DecodeRuneInString(s[i:])
		w = size
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(" ⏎ ")
		case r == '\t':
			b.WriteByte(' ')
		case r < 0x100 && unicode.IsControl(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029' || r == 0xfffe || r == 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// isPlain reports whether s is printable ASCII, which shown leaves as it is.
func isPlain(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// xmlText is s for an XML text node or attribute: XML 1.0 has no escape for most control
// characters (a document holding one is not well-formed), so they go as shown writes them,
// and markup is escaped.
func xmlText(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(shown(s))) // a strings.Builder does not fail
	return b.String()
}
