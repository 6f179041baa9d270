package decode

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/yaml"

	trainingv1alpha1 "github.com/zaya-operator/zaya-operator/api/v1alpha1"
)

// stored decodes YAML the way the API server's JSON reaches an unstructured client.
func stored(t *testing.T, doc string) map[string]any {
	t.Helper()
	js, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := utiljson.Unmarshal(js, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

const validJob = `
apiVersion: training.zaya.dev/v1alpha1
kind: ZayaTrainingJob
metadata: {name: j, namespace: ns, creationTimestamp: "2026-01-02T03:04:05Z"}
spec:
  nodes: 2
  network: {collectiveTimeout: 60m}
  checkpoint: {volume: {size: 2Ti}}
  template:
    spec:
      containers:
      - name: w
        image: busybox
        resources: {limits: {cpu: 500m, memory: 1E, ephemeral-storage: 1Ei}}
        livenessProbe: {httpGet: {port: 8080}}
status:
  restarts: 3
  startTime: "2026-01-02T03:04:05Z"
`

func TestIntoDecodesAValidJob(t *testing.T) {
	job := &trainingv1alpha1.ZayaTrainingJob{}
	if errs := Into(stored(t, validJob), job); errs != nil {
		t.Fatal(errs)
	}
	c := job.Spec.Template.Spec.Containers[0]
	if got := c.Resources.Limits[corev1.ResourceCPU]; got.Cmp(resource.MustParse("500m")) != 0 {
		t.Errorf("cpu = %s", got.String())
	}
	if job.Spec.Network.CollectiveTimeout.Duration != time.Hour || job.Status.Restarts != 3 ||
		c.LivenessProbe.HTTPGet.Port.IntValue() != 8080 || job.Status.StartTime == nil {
		t.Errorf("decoded %+v", job)
	}
}

// TestIntoRefusesWhatGoCannotHold: each value passes a loose schema but not Go decoding (or
// not at a bounded cost); the error names the field.
func TestIntoRefusesWhatGoCannotHold(t *testing.T) {
	cases := []struct {
		name, set, want string
	}{
		{"duration beyond time.Duration", `{spec: {network: {collectiveTimeout: 3000000h}}}`, "spec.network.collectiveTimeout"},
		{"duration not a duration", `{spec: {faultTolerance: {hangTimeout: forever}}}`, "spec.faultTolerance.hangTimeout"},
		{"int-or-string beyond int32", `{spec: {template: {spec: {containers: [{name: w, livenessProbe: {httpGet: {port: 99999999999}}}]}}}}`,
			"spec.template.spec.containers[0].livenessProbe.httpGet.port"},
		{"quantity with a huge negative exponent", `{spec: {template: {spec: {containers: [{name: w, resources: {limits: {cpu: "1e-999999999"}}}]}}}}`,
			"spec.template.spec.containers[0].resources.limits[cpu]"},
		{"quantity with a huge exponent", `{spec: {checkpoint: {volume: {size: "1e999999999"}}}}`, "spec.checkpoint.volume.size"},
		{"quantity as a huge number", `{spec: {template: {spec: {overhead: {cpu: 1e300}}}}}`, "spec.template.spec.overhead[cpu]"},
		{"quantity too long", `{spec: {checkpoint: {volume: {size: "` + strings.Repeat("9", 100) + `"}}}}`, "spec.checkpoint.volume.size"},
		{"quantity malformed", `{spec: {checkpoint: {volume: {size: "lots"}}}}`, "spec.checkpoint.volume.size"},
		{"int32 beyond range", `{spec: {nodes: 99999999999}}`, "spec.nodes"},
		{"int64 given as a huge float", `{spec: {activeDeadlineSeconds: 1e30}}`, "spec.activeDeadlineSeconds"},
		{"integer with a fraction", `{spec: {nodes: 1.5}}`, "spec.nodes"},
		{"string for an integer", `{spec: {nodes: four}}`, "spec.nodes"},
		{"list for an object", `{spec: {network: []}}`, "spec.network"},
		{"status time malformed", `{status: {startTime: yesterday}}`, "status.startTime"},
		{"status counter beyond int32", `{status: {restarts: 4294967296}}`, "status.restarts"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := stored(t, validJob)
			patch := stored(t, tc.set)
			merge(obj, patch)
			start := time.Now()
			errs := Into(obj, &trainingv1alpha1.ZayaTrainingJob{})
			if len(errs) == 0 {
				t.Fatalf("decoded; want an error naming %s", tc.want)
			}
			if errs[0].Field != tc.want {
				t.Errorf("error %q names %s, want %s", errs.ToAggregate(), errs[0].Field, tc.want)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %s", d) // a sanity bound, far above the microseconds it takes
			}
		})
	}
}

func merge(dst, src map[string]any) {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				merge(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// TestIntoAgreesWithTheConverter: for objects made from Go values, Into gives what the
// converter gives, so the check never refuses what Go can hold.
func TestIntoAgreesWithTheConverter(t *testing.T) {
	job := &trainingv1alpha1.ZayaTrainingJob{}
	if errs := Into(stored(t, validJob), job); errs != nil {
		t.Fatal(errs)
	}
	job.Default()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(job)
	if err != nil {
		t.Fatal(err)
	}
	// Through JSON, as the API server serves it.
	js, err := utiljson.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := utiljson.Unmarshal(js, &m); err != nil {
		t.Fatal(err)
	}
	again := &trainingv1alpha1.ZayaTrainingJob{}
	if errs := Into(m, again); errs != nil {
		t.Fatal(errs)
	}
	if d := cmp.Diff(job, again); d != "" {
		t.Errorf("round trip (-want +got):\n%s", d)
	}
}

func TestIntoWantsAPointerToAStruct(t *testing.T) {
	var n int
	if errs := Into(map[string]any{}, &n); errs == nil {
		t.Error("decoded into an int")
	}
}

// BenchmarkInto is the per-pass cost of reading a job as stored.
func BenchmarkInto(b *testing.B) {
	t := &testing.T{}
	obj := stored(t, validJob)
	for b.Loop() {
		if errs := Into(obj, &trainingv1alpha1.ZayaTrainingJob{}); errs != nil {
			b.Fatal(errs)
		}
	}
}
