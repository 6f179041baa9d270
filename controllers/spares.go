package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
	"github.com/zaya-operator/zaya-operator/controllers/admission"
	"github.com/zaya-operator/zaya-operator/controllers/recovery"
	"github.com/zaya-operator/zaya-operator/controllers/workerpod"
)

// The core's side of warm spares (controllers/restart keeps them): it renders, places and
// marks a spare's pod as it does every pod it makes.

// Spares is how many warm spares the admission allows of want.
func (p *pass) Spares(want int32) int32 { return p.admission.Spares(want) }

// CreateSpare makes the job's spare i, kept off unhealthy nodes, and returns its name.
func (p *pass) CreateSpare(ctx context.Context, i int32) (string, error) {
	job := p.job
	pod := newSparePod(job, i, p.r.spareImage(), p.r.SparePriorityClass)
	unhealthy, err := p.unhealthyNodes(ctx)
	if err != nil {
		return pod.Name, err
	}
	workerpod.PreferOtherNodes(&pod.Spec, unhealthy)
	p.admission.Place(pod, admission.Spares)
	p.marks.stamp(job, pod, p.r.Clock.Now()) // at the send: see markWindow
	return pod.Name, p.r.Create(ctx, pod)
}

// spareImage is the spares' container image.
func (r *ZayaTrainingJobReconciler) spareImage() string {
	if r.SpareImage != "" {
		return r.SpareImage
	}
	return recovery.DefaultSpareImage
}

// newSparePod is the job's spare i (recovery.SparePod), from rank 0's pod as this operator
// renders it, without a replacement's hold on a spare's node: with rank 0 replaced onto the
// spare's node, every new spare was kept to that node, beside rank 0, and never scheduled.
func newSparePod(job *trainingv1alpha1.ZayaTrainingJob, i int32, image, sparePriorityClass string) *corev1.Pod {
	return recovery.SparePod(job, renderRank(job, nil, 0, ""), i, image, sparePriorityClass)
}
