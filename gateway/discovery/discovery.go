// Package discovery keeps a rule's endpoints in step with Kubernetes. An InferencePool
// (inference.networking.k8s.io/v1) selects pods by label and lists target ports, one per
// data-parallel rank; every ready pod × target port becomes one endpoint of the rule, its event
// addresses derived from the engine family's contract (ZeroMQ base port + rank, or the HTTP drain)
// unless the pod's annotations say otherwise. Pods and the pool are watched through client-go
// informers; each change rewrites the rule's endpoint list in the live rule store, which rebuilds
// the rule's runtime (routers and subscriptions follow). Static discovery is the configuration
// file itself and needs nothing from this package.
package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/gateway/rules"
	inferencev1 "github.com/kvexact/kvexact/third_party/gateway-api-inference-extension/api/v1"
)

// Pod annotations that override what the contract implies.
const (
	// AnnotationEventsPort is the ZeroMQ publish port of rank 0 (rank r publishes on +r where the
	// contract says ranks offset ports); default: the contract's default publish port.
	AnnotationEventsPort = "kvexact.io/events-port"
	// AnnotationReplayPort is the ZeroMQ replay (ROUTER) port of rank 0; absent: no replay.
	AnnotationReplayPort = "kvexact.io/replay-port"
	// AnnotationRole is the endpoint role: normal (default), prefill or decode.
	AnnotationRole = "kvexact.io/role"
	// AnnotationBootstrapPort is SGLang's prefill bootstrap port (P/D).
	AnnotationBootstrapPort = "kvexact.io/bootstrap-port"
)

// PoolResource is the InferencePool's API resource.
var PoolResource = schema.GroupVersionResource{Group: inferencev1.GroupName, Version: "v1", Resource: "inferencepools"}

// Config configures a Kubernetes discovery.
type Config struct {
	// Store is the gateway's live rule set; Rule names the rule whose endpoints follow the pool.
	// The rule's other fields stay as configured.
	Store *rules.Store
	Rule  string
	// Namespace and Pool name the InferencePool (the pods are looked for in the same namespace).
	Namespace, Pool string
	Kube            kubernetes.Interface
	Dynamic         dynamic.Interface
	// Resync is the informers' resync period (0: none; events alone drive changes).
	Resync time.Duration
	Log    *slog.Logger
}

// Discovery watches one InferencePool and its pods.
type Discovery struct {
	cfg    Config
	synced chan struct{}
	kick   chan struct{}

	pool cache.GenericLister
	pods cache.Indexer

	mu    sync.Mutex
	stats Stats
}

// Stats count what the discovery did (for status and tests).
type Stats struct {
	Updates  int    // rule rewrites accepted by the store
	Rejected int    // rewrites the store refused
	LastErr  string // why the last rewrite was refused or skipped
}

// New checks the configuration.
func New(cfg Config) (*Discovery, error) {
	if cfg.Store == nil || cfg.Kube == nil || cfg.Dynamic == nil {
		return nil, errors.New("discovery: Store, Kube and Dynamic are required")
	}
	if cfg.Rule == "" || cfg.Namespace == "" || cfg.Pool == "" {
		return nil, errors.New("discovery: Rule, Namespace and Pool are required")
	}
	if _, ok := cfg.Store.Get(cfg.Rule); !ok {
		return nil, fmt.Errorf("discovery: rule %q is not in the configuration (it is the template the pool's endpoints fill)", cfg.Rule)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Discovery{cfg: cfg, synced: make(chan struct{}), kick: make(chan struct{}, 1)}, nil
}

// Synced is closed once the informers have listed the pool and the pods and the rule reflects them.
func (d *Discovery) Synced() <-chan struct{} { return d.synced }

// Run watches until ctx ends.
func (d *Discovery) Run(ctx context.Context) error {
	c := d.cfg
	pf := informers.NewSharedInformerFactoryWithOptions(c.Kube, c.Resync, informers.WithNamespace(c.Namespace))
	podInf := pf.Core().V1().Pods().Informer()
	df := dynamicinformer.NewFilteredDynamicSharedInformerFactory(c.Dynamic, c.Resync, c.Namespace, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", c.Pool).String()
	})
	poolInf := df.ForResource(PoolResource)
	h := cache.ResourceEventHandlerFuncs{AddFunc: func(any) { d.poke() }, UpdateFunc: func(any, any) { d.poke() }, DeleteFunc: func(any) { d.poke() }}
	if _, err := podInf.AddEventHandler(h); err != nil {
		return err
	}
	if _, err := poolInf.Informer().AddEventHandler(h); err != nil {
		return err
	}
	d.pods, d.pool = podInf.GetIndexer(), poolInf.Lister()
	pf.Start(ctx.Done())
	df.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), podInf.HasSynced, poolInf.Informer().HasSynced) {
		return ctx.Err()
	}
	d.reconcile()
	close(d.synced)
	for {
		select {
		case <-ctx.Done():
			pf.Shutdown()
			df.Shutdown()
			return nil
		case <-d.kick:
			d.reconcile()
		}
	}
}

// Stats returns the counters.
func (d *Discovery) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

func (d *Discovery) poke() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// reconcile rewrites the rule's endpoints from the informers' caches when they changed.
func (d *Discovery) reconcile() {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.cfg
	r, ok := c.Store.Get(c.Rule)
	if !ok {
		d.stats.LastErr = fmt.Sprintf("rule %q was deleted", c.Rule)
		return
	}
	pool, err := d.currentPool()
	var eps []rules.Endpoint
	if err != nil {
		d.stats.LastErr = err.Error()
		c.Log.Warn("discovery: no usable InferencePool; every endpoint is taken down", "pool", c.Pool, "err", err)
	} else {
		var pods []*corev1.Pod
		for _, o := range d.pods.List() {
			if p, ok := o.(*corev1.Pod); ok {
				pods = append(pods, p)
			}
		}
		eps, err = Endpoints(pool, pods, r.Contract())
		if err != nil {
			d.stats.LastErr = err.Error()
			c.Log.Warn("discovery: endpoints not derived", "pool", c.Pool, "err", err)
			return
		}
	}
	if len(eps) == 0 {
		// A rule needs an endpoint: keep the last known ones (or the configured placeholder), down,
		// so the picker answers 503 until a pod is ready again.
		eps = append([]rules.Endpoint(nil), r.Endpoints...)
		for i := range eps {
			eps[i].AdminDown = true
		}
	}
	if reflect.DeepEqual(eps, r.Endpoints) {
		return
	}
	r.Endpoints = eps
	if _, err := c.Store.Put(r); err != nil {
		d.stats.Rejected++
		d.stats.LastErr = err.Error()
		c.Log.Error("discovery: the pool's endpoints were refused", "rule", c.Rule, "err", err)
		return
	}
	d.stats.Updates++
	c.Log.Info("discovery: endpoints updated", "rule", c.Rule, "endpoints", len(eps))
}

func (d *Discovery) currentPool() (*inferencev1.InferencePool, error) {
	o, err := d.pool.ByNamespace(d.cfg.Namespace).Get(d.cfg.Pool)
	if err != nil {
		return nil, fmt.Errorf("InferencePool %s/%s: %w", d.cfg.Namespace, d.cfg.Pool, err)
	}
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("InferencePool %s/%s: unexpected object %T", d.cfg.Namespace, d.cfg.Pool, o)
	}
	var p inferencev1.InferencePool
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, &p, true); err != nil {
		return nil, fmt.Errorf("InferencePool %s/%s: %w", d.cfg.Namespace, d.cfg.Pool, err)
	}
	return &p, nil
}

// Endpoints derives a rule's endpoints from a pool and pods: each ready, running, non-terminating
// pod the selector matches, × each target port (rank r, in the pool's order), sorted by name. The
// endpoint is named after the pod (with "-r<rank>" when the pool lists several ports).
func Endpoints(pool *inferencev1.InferencePool, pods []*corev1.Pod, ct *contracts.Contract) ([]rules.Endpoint, error) {
	if ct == nil {
		return nil, errors.New("the rule has no engine contract")
	}
	if len(pool.Spec.TargetPorts) == 0 {
		return nil, fmt.Errorf("InferencePool %s: spec.targetPorts is empty", pool.Name)
	}
	ml := map[string]string{}
	for k, v := range pool.Spec.Selector.MatchLabels {
		ml[string(k)] = string(v)
	}
	if len(ml) == 0 {
		return nil, fmt.Errorf("InferencePool %s: spec.selector.matchLabels is empty (it would select every pod)", pool.Name)
	}
	sel := labels.SelectorFromSet(ml)
	var out []rules.Endpoint
	for _, p := range pods {
		if !sel.Matches(labels.Set(p.Labels)) || !ready(p) {
			continue
		}
		eps, err := podEndpoints(p, pool.Spec.TargetPorts, ct)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		out = append(out, eps...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// ready: running, not being deleted, with an IP and the Ready condition true.
func ready(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podEndpoints(p *corev1.Pod, ports []inferencev1.Port, ct *contracts.Contract) ([]rules.Endpoint, error) {
	ip := p.Status.PodIP
	if net.ParseIP(ip) == nil {
		return nil, fmt.Errorf("status.podIP %q is not an IP address", ip)
	}
	role := p.Annotations[AnnotationRole]
	if role != "" && role != "normal" && role != "prefill" && role != "decode" {
		return nil, fmt.Errorf("annotation %s: %q is not normal, prefill or decode", AnnotationRole, role)
	}
	eventsBase, err := annotationPort(p, AnnotationEventsPort, defaultPort(ct.Events.DefaultEndpoint))
	if err != nil {
		return nil, err
	}
	replayBase, err := annotationPort(p, AnnotationReplayPort, 0)
	if err != nil {
		return nil, err
	}
	bootstrap, err := annotationPort(p, AnnotationBootstrapPort, 0)
	if err != nil {
		return nil, err
	}
	var out []rules.Endpoint
	for r, port := range ports {
		if port.Number < 1 || port.Number > 65535 {
			return nil, fmt.Errorf("spec.targetPorts[%d].number %d is outside 1..65535", r, port.Number)
		}
		e := rules.Endpoint{Name: p.Name, Address: "http://" + net.JoinHostPort(ip, strconv.Itoa(int(port.Number))), Role: role, BootstrapPort: bootstrap}
		if len(ports) > 1 {
			e.Name = fmt.Sprintf("%s-r%d", p.Name, r)
		}
		switch ct.Transport {
		case "zmq-multipart-v1":
			off := 0
			if ct.Events.RankPortOffset {
				off = r
			}
			if eventsBase > 0 {
				e.Events.ZMQ = []string{"tcp://" + net.JoinHostPort(ip, strconv.Itoa(eventsBase+off))}
			}
			if replayBase > 0 {
				e.Events.Replay = []string{"tcp://" + net.JoinHostPort(ip, strconv.Itoa(replayBase+off))}
			}
		case "http-drain-v1":
			e.Events.Drain = e.Address
		}
		out = append(out, e)
	}
	return out, nil
}

// defaultPort is the port of a contract's default publish address ("tcp://*:5557" → 5557; 0 when
// the family has none).
func defaultPort(addr string) int {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return 0
	}
	n, err := strconv.Atoi(addr[i+1:])
	if err != nil {
		return 0
	}
	return n
}

func annotationPort(p *corev1.Pod, key string, def int) (int, error) {
	v, ok := p.Annotations[key]
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 65535-16 {
		return 0, fmt.Errorf("annotation %s: %q is not a port in 1..65519", key, v)
	}
	return n, nil
}
