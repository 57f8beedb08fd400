// Package leader owns the picker's leadership: with several Endpoint Picker replicas configured
// active-passive, one holds a Kubernetes Lease (client-go's leaderelection) and serves; the others
// keep their inventories warm from the engines' events and report not ready until they take the
// lease over. Active-active pickers (the default) need none of this (docs/replicas.md).
package leader

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Defaults, client-go's usual values for a controller.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// Config names the Lease and who competes for it.
type Config struct {
	Client          kubernetes.Interface
	Namespace, Name string // the Lease
	Identity        string // this replica (the pod name)
	LeaseDuration   time.Duration
	RenewDeadline   time.Duration
	RetryPeriod     time.Duration
	Log             *slog.Logger
}

// Elector says whether this replica holds the lease now.
type Elector struct {
	leading atomic.Bool
	done    chan struct{}
}

// Leading reports whether this replica holds the lease.
func (e *Elector) Leading() bool { return e.leading.Load() }

// Done is closed once Start's context is done and the lease released.
func (e *Elector) Done() <-chan struct{} { return e.done }

// Start competes for the lease until ctx is done, then releases it if held. A replica that loses
// the lease (it could not renew in time) stops leading at once and competes again.
func Start(ctx context.Context, cfg Config) (*Elector, error) {
	if cfg.Client == nil || cfg.Namespace == "" || cfg.Name == "" || cfg.Identity == "" {
		return nil, errors.New("leader: client, namespace, name and identity are required")
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.RenewDeadline <= 0 {
		cfg.RenewDeadline = DefaultRenewDeadline
	}
	if cfg.RetryPeriod <= 0 {
		cfg.RetryPeriod = DefaultRetryPeriod
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name},
		Client:     cfg.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
	}
	e := &Elector{done: make(chan struct{})}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, ReleaseOnCancel: true, Name: cfg.Name,
		LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				e.leading.Store(true)
				cfg.Log.Info("picker leading", "lease", cfg.Namespace+"/"+cfg.Name, "identity", cfg.Identity)
			},
			OnStoppedLeading: func() {
				e.leading.Store(false)
				cfg.Log.Warn("picker not leading", "lease", cfg.Namespace+"/"+cfg.Name, "identity", cfg.Identity)
			},
			OnNewLeader: func(id string) {
				if id != cfg.Identity {
					cfg.Log.Info("picker standing by", "leader", id)
				}
			},
		},
	})
	if err != nil {
		return nil, err
	}
	go func() {
		defer close(e.done)
		for ctx.Err() == nil {
			le.Run(ctx) // returns when leadership is lost or ctx is done
			e.leading.Store(false)
		}
	}()
	return e, nil
}
