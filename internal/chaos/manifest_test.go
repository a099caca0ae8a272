package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/objectfence"
)

// The control's manifest object is in the form objectfence wrote before
// manifests recorded their lock, and the Fence's Read reads it as it reads
// its own commits: the control's reads see its writes, and a later claim
// compares its token with the control's.
func TestUnfencedManifest(t *testing.T) {
	ctx := context.Background()
	store := &memStore{objs: map[string]memObject{}}
	f, err := objectfence.New(store, "m", "0")
	if err != nil {
		t.Fatal(err)
	}
	base, err := f.Claim(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Commit(ctx, base, []byte("c1-t3-1")); err != nil {
		t.Fatal(err)
	}
	if m, err := f.Read(ctx); err != nil || m.Token != 3 || string(m.Payload) != "c1-t3-1" {
		t.Fatalf("read after the commit: %+v, %v", m, err)
	}
	// A stale plain put goes through, and reads back as any commit does.
	if _, err := store.Put(ctx, "m", unfencedManifest(2, "c2-t2-5"), objectfence.Condition{}); err != nil {
		t.Fatal(err)
	}
	m, err := f.Read(ctx)
	if err != nil || m.Token != 2 || string(m.Payload) != "c2-t2-5" {
		t.Fatalf("read after the control's put: %+v, %v", m, err)
	}
	if _, err := f.Claim(ctx, 1); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("claim of token 1 over the control's token 2: %v, want stale", err)
	}
}

// memStore is an objectfence.Store in memory that honours conditions.
type memStore struct {
	mu   sync.Mutex
	objs map[string]memObject
	n    int
}

type memObject struct {
	body    []byte
	version string
}

func (s *memStore) Get(_ context.Context, key string) ([]byte, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objs[key]
	if !ok {
		return nil, "", fmt.Errorf("get %q: %w", key, objectfence.ErrNotFound)
	}
	return bytes.Clone(o.body), o.version, nil
}

func (s *memStore) Put(_ context.Context, key string, body []byte, cond objectfence.Condition) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objs[key]
	if (cond.IfAbsent && ok) || (cond.IfMatch != "" && (!ok || o.version != cond.IfMatch)) {
		return "", fmt.Errorf("put %q: %w", key, objectfence.ErrPreconditionFailed)
	}
	s.n++
	v := fmt.Sprintf("%q", fmt.Sprint(s.n))
	s.objs[key] = memObject{bytes.Clone(body), v}
	return v, nil
}

func (s *memStore) Delete(_ context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.objs, key)
	return nil
}

func (s *memStore) List(_ context.Context, prefix string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []string
	for k := range s.objs {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	return keys, nil
}
