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

// The control's manifest object is the one objectfence writes, byte for
// byte, and the Fence's Read reads it: the control's reads see its writes,
// and a later commit compares its token with the control's.
func TestUnfencedManifest(t *testing.T) {
	ctx := context.Background()
	store := &memStore{objs: map[string]memObject{}}
	f, err := objectfence.New(store, "m")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Commit(ctx, 3, []byte("c1-t3-1")); err != nil {
		t.Fatal(err)
	}
	if got, want := store.objs["m"].body, unfencedManifest(3, "c1-t3-1"); !bytes.Equal(got, want) {
		t.Fatalf("objectfence wrote %s, the control writes %s", got, want)
	}
	// A stale plain put goes through, and reads back as any commit does.
	if _, err := store.Put(ctx, "m", unfencedManifest(2, "c2-t2-5"), objectfence.Condition{}); err != nil {
		t.Fatal(err)
	}
	m, err := f.Read(ctx)
	if err != nil || m.Token != 2 || string(m.Payload) != "c2-t2-5" {
		t.Fatalf("read after the control's put: %+v, %v", m, err)
	}
	if _, err := f.Commit(ctx, 1, []byte("late")); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("commit of token 1 over the control's token 2: %v, want stale", err)
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
