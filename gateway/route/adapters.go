package route

// adapt maps a request for one of the rule's LoRA adapters to what the keyer needs: the base model
// (whose tokenizer and template render the prompt) and the LoRA name the engine hashes. Requests for
// other models come back unchanged; the caller's Request is never modified.
func (rt *Router) adapt(req *Request) *Request {
	for i := range rt.rule.Adapters {
		a := &rt.rule.Adapters[i]
		if a.Name == req.Model {
			r := *req
			r.Model, r.LoRAName = a.Base, a.LoRAName
			return &r
		}
	}
	return req
}
