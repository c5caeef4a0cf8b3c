package jobs

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys"
)

// ReplicasDefault is the replicas of a bucket [NewNATSClient] creates
// when Buckets.Replicas is zero.
const ReplicasDefault = 1

// Buckets says how [NewNATSClient] opens the job store's bucket and the
// key layer's bucket (JOBS_KEYS_<Service>). The zero value uses the
// default job bucket and creates a missing bucket with file storage and
// one replica.
type Buckets struct {
	// Job is the job store's bucket (see [WithBucket]). Defaults to
	// NATSBucketDefault.
	Job string
	// Storage is the storage of a bucket NewNATSClient creates. Defaults
	// to jetstream.FileStorage (the zero value).
	Storage jetstream.StorageType
	// Replicas are the replicas of a bucket NewNATSClient creates, 1 to
	// 5. Defaults to ReplicasDefault (1).
	Replicas int
	// NoCreate makes NewNATSClient use existing buckets only, as made by
	// an operator: a missing job bucket is an error wrapping
	// [ErrNotFound], a missing key bucket one wrapping
	// [jobkeys.ErrBucketNotFound]. Defaults to false: create them.
	NoCreate bool
}

// NewNATSClient returns a client over the job store and the key layer of
// one NATS JetStream context: a [NATSStore] on cfg.Buckets.Job, a
// [jobkeys.NATSStore] whose bucket is JOBS_KEYS_<Service>, and the key
// coordinator over it, made inside; missing buckets are created, the job
// bucket at once and the key bucket at its first use (see [Buckets]). It is [NewClient] in one call, for the common case;
// NewClient stays for stores of your own. cfg may be nil (every default);
// its KeyStore must be nil (the client makes it), its Now and Logger are
// the stores' and the coordinator's too, and a bad field is an error
// naming it. It waits at most js's default timeout for the buckets.
//
// [Client.Stop] closes the job store it made: call it when done, in a
// producer that never started too.
func NewNATSClient(js jetstream.JetStream, cfg *ClientConfig) (*Client, error) {
	if js == nil {
		return nil, errors.New("jobs: NewNATSClient: the JetStream context is nil")
	}
	var c ClientConfig
	if cfg != nil {
		c = *cfg
	}
	if c.KeyStore != nil {
		return nil, errors.New("jobs: NewNATSClient: ClientConfig.KeyStore is set: NewNATSClient makes the key store over js; use NewClient for a key store of your own")
	}
	b := c.Buckets
	c.Buckets = Buckets{}
	if b.Job == "" {
		b.Job = NATSBucketDefault
	}
	switch {
	case b.Replicas == 0:
		b.Replicas = ReplicasDefault
	case b.Replicas < 1 || b.Replicas > 5:
		return nil, fmt.Errorf("jobs: NewNATSClient: ClientConfig.Buckets.Replicas %d is outside 1..5", b.Replicas)
	}
	if b.Storage != jetstream.FileStorage && b.Storage != jetstream.MemoryStorage {
		return nil, fmt.Errorf("jobs: NewNATSClient: ClientConfig.Buckets.Storage %d is neither file nor memory storage", b.Storage)
	}
	if c.Service == "" {
		c.Service = ServiceDefault
	}
	opts := []NATSStoreOption{WithBucket(b.Job)}
	var keyOpts []jobkeys.NATSStoreOption
	if !b.NoCreate {
		opts = append(opts, WithCreateBucket(b.Storage, b.Replicas))
		keyOpts = append(keyOpts, jobkeys.WithCreateBuckets(b.Storage, b.Replicas))
	}
	store, err := NewNATSStore(js, &Config{Now: c.Now, Logger: c.Logger}, opts...)
	if err != nil {
		return nil, fmt.Errorf("jobs: NewNATSClient: job bucket %q: %w", b.Job, err)
	}
	keys, err := jobkeys.NewNATSStore(js, keyOpts...)
	if err != nil {
		return nil, fmt.Errorf("jobs: NewNATSClient: key store: %w", err)
	}
	if b.NoCreate {
		if err := keyBucketExists(js, keys.BucketName(c.Service)); err != nil {
			return nil, err
		}
	}
	coord, err := jobkeys.NewCoordinator(keys, &jobkeys.Config{Now: c.Now, Logger: c.Logger})
	if err != nil {
		return nil, fmt.Errorf("jobs: NewNATSClient: key coordinator: %w", err)
	}
	c.KeyStore = keys
	if c.JetStream == nil {
		c.JetStream = js
	}
	cl, err := NewClient(store, coord, &c)
	if err != nil {
		return nil, fmt.Errorf("jobs: NewNATSClient: %w", err)
	}
	cl.made = store
	return cl, nil
}

// keyBucketExists checks that the key bucket named bucket exists, within
// js's default timeout.
func keyBucketExists(js jetstream.JetStream, bucket string) error {
	ctx, cancel := context.WithTimeout(context.Background(), js.Options().DefaultTimeout)
	defer cancel()
	_, err := js.KeyValue(ctx, bucket)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
		return fmt.Errorf("jobs: NewNATSClient: key bucket %q does not exist, and ClientConfig.Buckets.NoCreate forbids creating it: %w", bucket, jobkeys.ErrBucketNotFound)
	case err != nil:
		return fmt.Errorf("jobs: NewNATSClient: open key bucket %q: %w: %w", bucket, ErrUnavailable, err)
	}
	return nil
}

// closeMade closes the job store NewNATSClient made, if any.
func (c *Client) closeMade(ctx context.Context) error {
	if c.made == nil {
		return nil
	}
	if err := c.made.Close(ctx); err != nil {
		return fmt.Errorf("jobs: Stop: close the job store: %w", err)
	}
	return nil
}
