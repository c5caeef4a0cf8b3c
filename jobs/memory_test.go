package jobs_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/leakcheck"
	"github.com/jobkeys/jobkeys/jobs"
	"github.com/jobkeys/jobkeys/jobs/jobstest"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func newMemoryStore(t *testing.T, cfg *jobs.Config) jobs.Store {
	s, err := jobs.NewMemoryStore(cfg)
	require.NoError(t, err)
	return s
}

func TestMemoryStoreConformance(t *testing.T) {
	t.Parallel()
	jobstest.Run(t, newMemoryStore)
}
