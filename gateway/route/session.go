package route

import (
	"context"
	"sync"
	"time"
)

// sessions pins a conversation to its (prefill, decode) pair for a TTL (mode-1 tier 0). The key is
// the client's X-Conversation-Id, else the body's user. Stickiness never overrides health: a pinned
// endpoint that is excluded is simply not used.
type sessions struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	pins    map[string]sessionPin
	inserts int
}

type sessionPin struct {
	prefill, decode int // Endpoint.Index
	expires         time.Time
}

// maxSweep bounds the victims of one expiry pass, so no request pays for a huge sweep.
const maxSweep = 256

func newSessions(ttl time.Duration, now func() time.Time) *sessions {
	return &sessions{ttl: ttl, now: now, pins: map[string]sessionPin{}}
}

func (s *sessions) get(key string) (sessionPin, bool) {
	if key == "" {
		return sessionPin{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pins[key]
	if !ok || s.now().After(p.expires) {
		return sessionPin{}, false
	}
	return p, true
}

func (s *sessions) put(key string, prefill, decode int) {
	if key == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.pins[key] = sessionPin{prefill: prefill, decode: decode, expires: now.Add(s.ttl)}
	s.inserts++
	if s.inserts%64 == 0 {
		n := 0
		for k, p := range s.pins {
			if now.After(p.expires) {
				delete(s.pins, k)
				if n++; n >= maxSweep {
					break
				}
			}
		}
	}
}

func (s *sessions) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pins)
}

// sessionTier picks the prefill endpoint a conversation is pinned to, while it is a candidate.
type sessionTier struct{ s *sessions }

func (t sessionTier) pick(_ context.Context, c *choice) (pick, error) {
	c.pin, c.pinned = t.s.get(c.req.sessionKey())
	if c.pinned {
		if p := byIndex(c.cands, c.pin.prefill); p != nil {
			return pick{ep: p, tier: TierSession}, nil
		}
	}
	return pick{}, nil
}
