// Package bounded cuts the words status and events carry (a worker's termination message, a
// rule's match, the operator's own messages naming a user's pods) to the schema's bounds, on a
// rune boundary, and the counters status keeps to the schema's bound (Count): whatever a
// tenant writes, the status stays one the CRD accepts.
package bounded

import (
	"unicode/utf8"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// Count adds n to a status counter, staying within [0, MaxStatusCount] whatever was stored.
func Count(c int32, n int) int32 {
	return int32(min(max(int64(c), 0)+int64(max(n, 0)), trainingv1alpha1.MaxStatusCount))
}

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
