// Package apibudget is pav's API budget: how many requests to the API server
// one operation of a volume's life may make, pav's own (the informers' list and
// watch are shared by every volume and left out; so are events). The
// controller's and the node plugin's benchmarks (BenchmarkAPIRequestsPerVolume,
// `make bench`, smoke-run by `make test`) fail above it; `make bench-e2e`
// prints what a real cluster sees next to it.
//
// The figures are what the design needs, not a round guess: a request more
// than these is a regression to explain (and then the budget is raised here,
// with the reason), because every request is paid by every volume of every
// node and, at scale, by the API server.
//
// Not counted in Create and Delete: the node plugin of the node a
// controller-side pod ran on relays the pod's success with one patch of the
// pod (internal/endrelay), so that the operation ends a kubelet relist sooner;
// one per validation, creation or deletion pod that succeeds, made by another
// process than the one the operation's budget measures.
package apibudget

const (
	// Create is CreateVolume with a validation and a creation pod. Writes (9):
	// the PavVolume record's create and 4 updates (each pod's UID recorded
	// before the pod is asked for; →Creating, →Created), each pod's create and
	// delete. Reads (5): the record (a new volume is not cached yet), the
	// records of its handle (refusing a handle another volume has; a new
	// handle is not cached either), the PVC and the StorageClass of the
	// templates' context, and one pod read when the informer lags behind a
	// pod's deletion.
	Create = 14
	// Delete is DeleteVolume with a deletion pod. Writes (6): the record's 3
	// updates (→Deleting, the pod's UID, its outcome) and delete, the pod's
	// create and delete. Reads (2): the pod, when the informer lags behind
	// its creation and its deletion.
	Delete = 8
	// Stage is NodeStageVolume for a volume pav created: the node, the PV and
	// the PVC read for the staging pod's template context, the pod's create,
	// and its delete once it completed (a KeepRunning pod stays: one fewer).
	// A static volume lists this node's pods (to find its PV) instead of
	// deleting a completed pod.
	Stage = 5
	// Unstage is NodeUnstageVolume: the unstaging pod's create and delete,
	// and the KeepRunning staging pod's delete.
	Unstage = 3
)
