package jobs

import "github.com/jobkeys/jobkeys"

// KeyCoordinator returns the key coordinator the client admits and runs
// its jobs through: the one given to [NewClient], or the one
// [NewNATSClient] made. Tools that show the keys beside the jobs (package
// jobs/jobsweb) read the key state through it.
func (c *Client) KeyCoordinator() *jobkeys.KeyCoordinator { return c.coord }

// Service returns the key-layer service of the client's kinds
// (ClientConfig.Service, or its default): their keys live in bucket
// JOBS_KEYS_<Service>.
func (c *Client) Service() string { return c.cfg.Service }
