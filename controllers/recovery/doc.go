// Package recovery holds the verdicts of the operator's recovery, as pure functions of the
// job's spec, its gang (gang) and the failure patterns (attribution): what a failed pod does
// to the job (Judge), whether the gang is done (Succeeded), which failure of a restart is its root and which its cascade
// (RootFailure, InPlaceRoot, CascadeWait), what a failure was (Attribute), which failures keep
// a job off a node (Quarantines, HardwareRoot), and how a worker restarts in its pod (the
// container restart rules or the supervisor's rule: RestartRules, SetInPlace, PodRestartRules,
// SupervisorExits). controllers/restart carries the verdicts out: it writes status, quarantines
// nodes and has pods deleted or created.
package recovery
