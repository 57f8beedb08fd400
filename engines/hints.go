package engines

// Hints supplies the family's part of ctk's operator hints: the flag or setting, as the engine's
// own documentation names it, that fixes a failed check. ctk lists every family's part in registry
// order (engines that share a setting grouped), so a hint names each engine that has the setting
// and adding a family adds its part without touching ctk.
type Hints interface {
	// Hint is the family's setting for topic, "" when the family has none.
	Hint(HintTopic) string
}

// HintTopic is the check a hint is for.
type HintTopic int

// The hint topics.
const (
	HintEventsEnable  HintTopic = iota // how KV events are switched on
	HintEventsAddress                  // how the pool names the event stream when not events.zmq
	HintBlockSize                      // the flag that sets tokens per block
	HintSequence                       // what keeps the event stream from losing messages
	HintClear                          // the event that announces a cache reset
	HintServedModel                    // the flag that sets the served model name
	HintChatTemplate                   // the flag that overrides the tokenizer's chat template
	HintLoRALoad                       // how an adapter is loaded at start
	HintLoRAServe                      // the flags that serve LoRA adapters
)
