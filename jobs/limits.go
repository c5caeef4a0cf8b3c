package jobs

// Limits on requests and records. Requests beyond them are refused with
// [ErrConflict] before anything is written, in an error that names the limit.
const (
	// ProgressLimit is how many progress entries a job keeps: the newest.
	ProgressLimit = 32
	// ClaimCountLimit caps ClaimRequest.Count.
	ClaimCountLimit = 100
	// ListLimit caps ListRequest.Limit.
	ListLimit = 100
	// LabelLimit is the most UTF-16 code units (JavaScript's String length,
	// as the seed counts) of a trimmed progress label: 160 characters of the
	// Basic Multilingual Plane, 80 emoji.
	LabelLimit = 160
	// InputSizeLimit is the most bytes of EnqueueRequest.Input.
	InputSizeLimit = 256 << 10
	// ArtifactSizeLimit is the most bytes of SettleRequest.Artifact.
	ArtifactSizeLimit = 256 << 10
	// BindingSizeLimit is the most bytes of RenewRequest.Binding.
	BindingSizeLimit = 16 << 10
	// IdentifierSizeLimit is the most bytes of an identifier: a job, channel,
	// type, target, idempotency key, fingerprint, origin or owner. It keeps
	// every KV subject a store builds from them far below NATS's 4 KiB
	// control-line limit.
	IdentifierSizeLimit = 256
	// ReasonSizeLimit is the most bytes of the Reason of a requeue, fail,
	// pause or supersede.
	ReasonSizeLimit = 2048
)
