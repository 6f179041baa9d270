package train

import (
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/zaya-operator/zaya-operator/api/contract"
)

// Metrics is what a worker process exports to Prometheus (rank 0 of the process reports).
type Metrics struct {
	Step           prometheus.Gauge
	Loss           prometheus.Gauge
	TokensPerSec   prometheus.Gauge
	CheckpointStep prometheus.Gauge
	SaveSeconds    prometheus.Histogram
}

// NewMetrics registers the worker's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Step:           prometheus.NewGauge(prometheus.GaugeOpts{Name: "zaya_worker_step", Help: "Training steps done."}),
		Loss:           prometheus.NewGauge(prometheus.GaugeOpts{Name: "zaya_worker_loss", Help: "Loss of the last step, averaged over all ranks."}),
		TokensPerSec:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "zaya_worker_tokens_per_second", Help: "Tokens trained per second by the whole job since this process started."}),
		CheckpointStep: prometheus.NewGauge(prometheus.GaugeOpts{Name: "zaya_worker_checkpoint_step", Help: "Step of the last committed checkpoint."}),
		SaveSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "zaya_worker_checkpoint_save_seconds", Help: "Seconds a checkpoint save held training (the snapshot, plus waiting for the previous save when storage is slower than the interval).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
	}
	reg.MustRegister(m.Step, m.Loss, m.TokensPerSec, m.CheckpointStep, m.SaveSeconds)
	return m
}

// serveMetrics serves reg, and progress at contract.ProgressPath, on addr until the process
// exits; it returns the bound address.
func serveMetrics(addr string, reg *prometheus.Registry, progress *board) (string, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle(contract.ProgressPath, progress)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = l.Close()
		}
	}()
	return l.Addr().String(), nil
}
