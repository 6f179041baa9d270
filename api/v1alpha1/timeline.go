package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// StampRecovery edits the timeline of the recovery under way: the last failure's, on both its
// records (lastFailure and the newest of recentFailures). A failure recorded without a
// timeline (by an operator before the field, or one not restarted from) gets none.
func (s *ZayaTrainingJobStatus) StampRecovery(edit func(*RecoveryTimeline)) {
	last := s.LastFailure
	if last == nil || last.Recovery == nil {
		return
	}
	edit(last.Recovery)
	if len(s.RecentFailures) > 0 {
		if r := &s.RecentFailures[0]; r.Recovery != nil && r.Recovery != last.Recovery && r.Time.Equal(&last.Time) && r.Reason == last.Reason {
			edit(r.Recovery)
		}
	}
}

// Stamp is t as a timeline's reading.
func Stamp(t time.Time) *metav1.MicroTime {
	m := metav1.NewMicroTime(t)
	return &m
}
