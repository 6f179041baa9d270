package train

import (
	"bufio"
	"fmt"
	"strings"
)

// Progress is what rank 0's log says about a run: the last step it finished, the step it
// resumed from (0: a fresh start), and the checkpoints it committed, in order.
type Progress struct {
	Last, Resumed int64
	Committed     []int64
}

// ParseLog reads rank 0's log lines ("step N loss ...", "resumed from step N",
// "checkpoint step N committed") into a Progress.
func ParseLog(log string) Progress {
	var p Progress
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		var n int64
		var f float64
		switch line := sc.Text(); {
		case strings.HasPrefix(line, "step "):
			if k, _ := fmt.Sscanf(line, "step %d loss %g", &n, &f); k == 2 {
				p.Last = max(p.Last, n)
			}
		case strings.HasPrefix(line, "resumed from step "):
			if _, err := fmt.Sscanf(line, "resumed from step %d", &n); err == nil {
				p.Resumed = n
				p.Last = max(p.Last, n)
			}
		case strings.HasPrefix(line, "checkpoint step "):
			if _, err := fmt.Sscanf(line, "checkpoint step %d committed", &n); err == nil {
				p.Committed = append(p.Committed, n)
			}
		}
	}
	return p
}
