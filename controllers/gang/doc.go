// Package gang reads a job's pods as the state of its current attempt: which pod holds each
// rank, which are stale, draining, replaced or deleted under the gang, how many are placed and
// ready, each rank's worker restarts against the count before the restart's fault, what the
// workers' termination messages say of checkpoints and resumes, and the creations the cache
// has not shown yet (expectations). Everything here is a pure function of the pods and the
// job's status, but for Creations, which remembers what this process created; nothing calls
// the API server. Decisions on that state (recovery, accounting) live with their concerns.
package gang
