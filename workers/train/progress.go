package train

import (
	"bufio"
	"fmt"
	"strings"
	"time"
)

// Progress is what rank 0's log says about a run: the last step it finished, the step it
// resumed from (0: a fresh start), the checkpoints it committed, in order, and when it
// finished each step it logged.
type Progress struct {
	Last, Resumed int64
	Committed     []int64
	StepAt        map[int64]time.Time
}

// ParseLog reads rank 0's log lines ("step N loss ... at <time>", "resumed from step N",
// "checkpoint step N committed") into a Progress.
func ParseLog(log string) Progress {
	p := Progress{StepAt: map[int64]time.Time{}}
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		var n int64
		var f float64
		switch line := sc.Text(); {
		case strings.HasPrefix(line, "step "):
			if k, _ := fmt.Sscanf(line, "step %d loss %g", &n, &f); k == 2 {
				p.Last = max(p.Last, n)
				if i := strings.LastIndex(line, " at "); i > 0 {
					if t, err := time.Parse(time.RFC3339Nano, line[i+4:]); err == nil {
						p.StepAt[n] = t
					}
				}
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
