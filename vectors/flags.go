package vectors

// The flags a case can carry: what it exercises, so a failure says which kind of input broke and a
// reader can pick the cases of one kind. They are derived from the case itself (Flags), for both
// schemas, so an original's cases carry them too; a project file lists each flag it uses, with this
// description, in its notes map.
var flagDescriptions = []struct {
	Flag, Description string
	has               func(*Case) bool
}{
	{"EmptyPrompt", "no tokens: nothing is hashed", func(c *Case) bool { return len(c.Tokens) == 0 }},
	{"PartialBlock", "the tokens end in a partial block, which is never hashed or published", func(c *Case) bool {
		n := len(c.Tokens)
		if c.Bigram && n > 0 {
			n--
		}
		return n > 0 && n%c.BlockSize != 0
	}},
	{"LargeTokenIds", "a token id of 2^31 or more (wider integer encodings in every serialization)", func(c *Case) bool {
		for _, t := range c.Tokens {
			if t >= 1<<31 {
				return true
			}
		}
		return false
	}},
	{"EmptySeed", "the seed is the empty string: a valid seed, not an unset one", func(c *Case) bool { return c.Seed != nil && *c.Seed == "" }},
	{"EngineRootSeed", "seed unset: the engine resolved its own root seed (the group's rootSeed)", func(c *Case) bool { return c.RootSeed != nil }},
	{"UnreproducibleRoot", "the engine's root cannot be reproduced (random per process, or no seed rule known): result acceptable, nothing compared", func(c *Case) bool { return !c.Reproducible }},
	{"LoRA", "the request names a LoRA adapter", func(c *Case) bool { return c.Request.LoRAName != "" }},
	{"CacheSalt", "the request carries a cache salt", func(c *Case) bool { return c.Request.CacheSalt != "" }},
	{"Multimodal", "the request has multimodal items, extra keys of the blocks they overlap", func(c *Case) bool { return len(c.Request.MM) > 0 }},
	{"PromptEmbeds", "the request has prompt embeddings, hashed per block", func(c *Case) bool { return c.Request.PromptEmbedsRows != nil }},
	{"Decode", "the prompt is hashed first, then one token at a time (promptLength)", func(c *Case) bool { return c.PromptLen > 0 }},
	{"ExtraKeysDiffer", "the decode path's extra keys differ from a one-shot computation (extraKeysOneShot)", func(c *Case) bool { return c.ExtraKeysOneShot != nil }},
	{"KVCacheGroup", "a coarser KV-cache group's hashes are pinned too (groupBlockSize)", func(c *Case) bool { return c.GroupBlockSize > 0 }},
	{"Bigram", "EAGLE bigram units: unit j = (t[j], t[j+1])", func(c *Case) bool { return c.Bigram }},
	{"UnsaltedDigests", "a salted case that also pins the engine's internal unsalted hashes (never published)", func(c *Case) bool { return c.Expected.UnsaltedDigests != nil }},
}

// Flags derives the flags of a case from its content, in the documented order.
func Flags(c *Case) []string {
	var out []string
	for _, f := range flagDescriptions {
		if f.has(c) {
			out = append(out, f.Flag)
		}
	}
	return out
}

// FlagDescription is the documentation of a flag, a block-hash case's or an event sample's ("" for
// an unknown one).
func FlagDescription(flag string) string {
	for _, f := range flagDescriptions {
		if f.Flag == flag {
			return f.Description
		}
	}
	return sampleFlagDescriptions[flag]
}
