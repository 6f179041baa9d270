package train

import (
	"slices"
	"testing"
)

func TestParseLogReadsWhatRankZeroPrints(t *testing.T) {
	p := ParseLog("zaya-worker: metrics on http://x/metrics\nresumed from step 40\nstep 41 loss 0.5 tokens/s 9\n" +
		"checkpoint step 60 committed\nstep 61 loss 0.4 tokens/s 9\nstep 62 loss\n")
	if p.Last != 61 || p.Resumed != 40 || !slices.Equal(p.Committed, []int64{60}) {
		t.Errorf("ParseLog = %+v, want last 61, resumed 40, committed [60]", p)
	}
	if p := ParseLog(""); p.Last != 0 || p.Resumed != 0 || p.Committed != nil {
		t.Errorf("empty log: %+v", p)
	}
}
