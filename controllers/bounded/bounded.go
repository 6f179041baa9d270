// Package bounded cuts the words status and events carry (a worker's termination message, a
// rule's match, the operator's own messages naming a user's pods) to the schema's bounds, on a
// rune boundary: whatever a tenant writes, the status stays one the CRD accepts.
package bounded

import "unicode/utf8"

// MessageLength bounds condition and failure messages (the API allows 32768; status stays
// small).
const MessageLength = 1024

// Message cuts s to MessageLength bytes.
func Message(s string) string { return Cut(s, MessageLength) }

// Cut shortens s to at most n bytes, on a rune boundary, marking the cut with "...".
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n <= len("...") {
		return "..."[:max(n, 0)]
	}
	cut := n - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
