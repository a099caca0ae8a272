package objectfence_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/objectfence"
	"github.com/leasefence/leasefence/internal/s3test"
)

// counting counts the requests that reach a real store.
type counting struct {
	objectfence.Store
	n atomic.Int32
}

func (c *counting) Get(ctx context.Context, key string) ([]byte, string, error) {
	c.n.Add(1)
	return c.Store.Get(ctx, key)
}

func (c *counting) Put(ctx context.Context, key string, body []byte, cond objectfence.Condition) (string, error) {
	c.n.Add(1)
	return c.Store.Put(ctx, key, body, cond)
}

func (c *counting) Delete(ctx context.Context, key string) error {
	c.n.Add(1)
	return c.Store.Delete(ctx, key)
}

func (c *counting) List(ctx context.Context, prefix string) ([]string, error) {
	c.n.Add(1)
	return c.Store.List(ctx, prefix)
}

func TestBadInputSendsNothing(t *testing.T) {
	srv, bucket := s3test.StartVersityT(t)
	real, err := objectfence.NewS3Store(srv.Client(), bucket)
	if err != nil {
		t.Fatal(err)
	}
	store := &counting{Store: real}
	f, err := objectfence.New(store, "m", lockName)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	// Bases of another manifest, and of this one under another lock,
	// claimed through the real store before counting starts.
	claim := func(key, lock string) objectfence.Manifest {
		g, err := objectfence.New(real, key, lock)
		if err != nil {
			t.Fatal(err)
		}
		m, err := g.Claim(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	otherManifest, otherLock := claim("other", lockName), claim("m", "tables/customers")
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"nil S3 client", func() error { _, err := objectfence.NewS3Store(nil, "b"); return err }},
		{"empty bucket", func() error { _, err := objectfence.NewS3Store(srv.Client(), ""); return err }},
		{"nil store", func() error { _, err := objectfence.New(nil, "m", lockName); return err }},
		{"empty key", func() error { _, err := objectfence.New(store, "", lockName); return err }},
		{"empty lock name", func() error { _, err := objectfence.New(store, "m", ""); return err }},
		{"lock name not UTF-8", func() error { _, err := objectfence.New(store, "m", "tables/\xff"); return err }},
		{"nil option", func() error { _, err := objectfence.New(store, "m", lockName, nil); return err }},
		{"empty data prefix", func() error {
			_, err := objectfence.New(store, "m", lockName, objectfence.WithDataPrefix(""))
			return err
		}},
		{"empty probe prefix", func() error {
			_, err := objectfence.New(store, "m", lockName, objectfence.WithProbePrefix(""))
			return err
		}},
		{"zero attempts", func() error { _, err := objectfence.New(store, "m", lockName, objectfence.WithAttempts(0)); return err }},
		{"commit on no base", func() error { _, err := f.Commit(ctx, objectfence.Manifest{}, nil); return err }},
		{"commit on a made base", func() error {
			_, err := f.Commit(ctx, objectfence.Manifest{Token: 5, Lock: lockName, Version: `"abc"`}, nil)
			return err
		}},
		{"commit on a base of another manifest", func() error { _, err := f.Commit(ctx, otherManifest, nil); return err }},
		{"commit on a base of another lock", func() error { _, err := f.Commit(ctx, otherLock, nil); return err }},
		{"claim token 0", func() error { _, err := f.Claim(ctx, 0); return err }},
		{"claim token -1", func() error { _, err := f.Claim(ctx, -1); return err }},
		{"data key token 0", func() error { _, err := f.DataKey(0, "x"); return err }},
		{"data key empty name", func() error { _, err := f.DataKey(1, ""); return err }},
		{"orphans nil func", func() error { _, err := f.Orphans(ctx, nil); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, fence.ErrInvalidArgument) {
				t.Fatalf("err = %v, want ErrInvalidArgument", err)
			}
		})
	}
	if n := store.n.Load(); n != 0 {
		t.Fatalf("bad input sent %d requests", n)
	}
}
