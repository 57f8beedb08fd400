package ctk

import (
	"strings"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/registry"
)

// Operator hints that name every engine's own setting: each family supplies its part
// (engines.Hints), so the texts list the registered families without ctk naming one.
var (
	eventsHint = "enable prefix caching and KV events on the engine (" + engineHint(engines.HintEventsEnable, " and ", " ", "; ") +
		") and give its publisher addresses as events.zmq, one per data-parallel rank in rank order (" + engineHint(engines.HintEventsAddress, " and ", ": ", "; ") + ")"
	sequenceHint = "the gateway loses blocks on every gap: raise the publisher's hwm and max_queue_size, configure events.replay (replay_endpoint) so gaps can be refilled, and for " +
		engineHint(engines.HintSequence, " and ", " ", ", ")
	clearHint = "the gateway learns of a cache reset only from the engine's event (" + engineHint(engines.HintClear, " and ", " ", ", ") +
		"): check the engine publishes it (events enabled, publisher reachable)"
	templateHint = "stage the chat template the engine uses: the engine's tokenizer_config.json chat_template (" +
		engineHint(engines.HintChatTemplate, " and ", " ", ", ") + " override it)"
	blockSizeFlags   = engineHint(engines.HintBlockSize, " and ", " ", ", ")
	servedModelFlags = engineHint(engines.HintServedModel, "/", " ", ", ")
)

// engineHint lists the registered families' settings for topic in registry order: families with
// the same setting share it (their display names joined by and), each group's names and setting
// joined by between, the groups by sep ("vLLM and SGLang --chat-template, llama.cpp --jinja").
func engineHint(topic engines.HintTopic, and, between, sep string) string {
	type group struct {
		names   []string
		setting string
	}
	var gs []*group
	for _, f := range registry.All() {
		s := f.Hint(topic)
		if s == "" {
			continue
		}
		i := 0
		for i < len(gs) && gs[i].setting != s {
			i++
		}
		if i == len(gs) {
			gs = append(gs, &group{setting: s})
		}
		gs[i].names = append(gs[i].names, f.Display())
	}
	parts := make([]string, len(gs))
	for i, g := range gs {
		parts[i] = strings.Join(g.names, and) + between + g.setting
	}
	return strings.Join(parts, sep)
}

// family is the endpoint's engine family (the pool checked that it is registered).
func (r *endpointRun) family() engines.Family {
	f, _ := registry.Lookup(r.ep.Family)
	return f
}
