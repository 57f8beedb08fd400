package jinja

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
	"unsafe"
)

var (
	errBreak      = errors.New("break")
	errContinue   = errors.New("continue")
	errSliceIndex = errors.New("slice indices must be integers or none")
)

// =============================================================================
// Scope
// =============================================================================

type scope struct {
	vars   map[string]Value
	parent *scope
}

func newScope(parent *scope) *scope {
	return &scope{vars: make(map[string]Value, 4), parent: parent}
}

func (s *scope) get(name string) (Value, bool) {
	if v, ok := s.vars[name]; ok {
		return v, true
	}
	if s.parent != nil {
		return s.parent.get(name)
	}
	return Undefined(), false
}

func (s *scope) set(name string, val Value) {
	s.vars[name] = val
}

// =============================================================================
// Evaluator
// =============================================================================

type evaluator struct {
	scope    *scope
	builtins *scope
	output   strings.Builder
}

func (e *evaluator) execNodes(nodes []node) error {
	for _, n := range nodes {
		if err := e.execNode(n); err != nil {
			return err
		}
	}
	return nil
}

func (e *evaluator) execNode(n node) error {
	switch nd := n.(type) {
	case *textNode:
		e.output.WriteString(nd.text)
		return nil

	case *outputNode:
		val, err := e.evalExpr(nd.expression)
		if err != nil {
			return err
		}
		e.output.WriteString(printValue(val))
		return nil

	case *ifNode:
		return e.execIf(nd)

	case *forNode:
		return e.execFor(nd)

	case *setNode:
		return e.execSet(nd)

	case *setBlockNode:
		return e.execSetBlock(nd)

	case *macroNode:
		return e.execMacro(nd)

	case *callNode:
		return e.execCall(nd)

	case *filterBlockNode:
		return e.execFilterBlock(nd)

	case *breakNode:
		return errBreak

	case *continueNode:
		return errContinue

	default:
		return fmt.Errorf("unknown node type %T", n)
	}
}

func (e *evaluator) execIf(n *ifNode) error {
	for _, branch := range n.branches {
		if branch.condition == nil {
			// else branch
			return e.execNodes(branch.body)
		}
		cond, err := e.evalExpr(branch.condition)
		if err != nil {
			return err
		}
		if cond.IsTruthy() {
			return e.execNodes(branch.body)
		}
	}
	return nil
}

func (e *evaluator) execFor(n *forNode) error {
	iterVal, err := e.evalExpr(n.iter)
	if err != nil {
		return err
	}
	return e.execForItems(n, iterVal, 0)
}

func (e *evaluator) execForItems(n *forNode, iterVal Value, depth int64) error {

	var items []Value
	switch {
	case iterVal.IsList():
		items = iterVal.AsList().Items
	case iterVal.IsDict():
		d := iterVal.AsDict()
		for _, key := range d.Keys {
			items = append(items, NewString(key))
		}
	case iterVal.IsString():
		for _, r := range iterVal.AsString() {
			items = append(items, NewString(string(r)))
		}
	default:
		// Empty iteration.
	}

	// Apply filter if present.
	if n.filterExpr != nil {
		var filtered []Value
		for _, item := range items {
			child := newScope(e.scope)
			bindLoopItem(child, n, item)
			old := e.scope
			e.scope = child
			fv, err := e.evalExpr(n.filterExpr)
			e.scope = old
			if err != nil {
				return err
			}
			if fv.IsTruthy() {
				filtered = append(filtered, item)
			}
		}
		items = filtered
	}

	if len(items) == 0 {
		if n.elseBody != nil {
			return e.execNodes(n.elseBody)
		}
		return nil
	}

	total := int64(len(items))

	// Loop metadata persists, but each iteration gets its own assignment scope.
	loop := NewDict()
	ld := loop.AsDict()
	ld.Set("length", NewInt(total))
	ld.Set("depth", NewInt(depth+1))
	ld.Set("depth0", NewInt(depth))
	var previous Value
	ld.Set("changed", NewCallable("loop.changed", func(args []Value, kwargs map[string]Value) (Value, error) {
		current := NewList(args)
		changed := !current.Equals(previous)
		previous = current
		return NewBool(changed), nil
	}))
	if n.recursive {
		parent := e.scope
		ld.Set("__call__", NewCallable("loop", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) != 1 {
				return Undefined(), fmt.Errorf("recursive loop requires one iterable")
			}
			nested := evaluator{scope: parent, builtins: e.builtins}
			if err := nested.execForItems(n, args[0], depth+1); err != nil {
				return Undefined(), err
			}
			return NewString(nested.output.String()), nil
		}))
	}

	for i, item := range items {
		child := newScope(e.scope)
		child.set("loop", loop)
		// Set loop variable(s).
		if n.keyVar != "" {
			// Destructuring: for key, val in items
			if item.IsList() && item.AsList().Len() >= 2 {
				child.set(n.keyVar, item.AsList().Get(0))
				child.set(n.valVar, item.AsList().Get(1))
			} else {
				child.set(n.keyVar, NewInt(int64(i)))
				child.set(n.valVar, item)
			}
		} else {
			child.set(n.valVar, item)
		}

		// Update loop object for this iteration.
		idx := int64(i)
		ld.Data["index"] = NewInt(idx + 1)
		ld.Data["index0"] = NewInt(idx)
		ld.Data["revindex"] = NewInt(total - idx)
		ld.Data["revindex0"] = NewInt(total - idx - 1)
		ld.Data["first"] = NewBool(i == 0)
		ld.Data["last"] = NewBool(i == len(items)-1)

		if i > 0 {
			ld.Data["previtem"] = items[i-1]
		} else {
			ld.Data["previtem"] = Undefined()
		}
		if i < len(items)-1 {
			ld.Data["nextitem"] = items[i+1]
		} else {
			ld.Data["nextitem"] = Undefined()
		}

		// cycle function — capture idx by value for closure correctness.
		cycleIdx := idx
		ld.Data["cycle"] = NewCallable("loop.cycle", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) == 0 {
				return Undefined(), nil
			}
			return args[int(cycleIdx)%len(args)], nil
		})

		old := e.scope
		e.scope = child

		err := e.execNodes(n.body)
		e.scope = old

		if err != nil {
			if errors.Is(err, errBreak) {
				break
			}
			if errors.Is(err, errContinue) {
				continue
			}
			return err
		}
	}

	return nil
}

func bindLoopItem(child *scope, n *forNode, item Value) {
	if n.keyVar != "" && item.IsList() && item.AsList().Len() == 2 {
		child.set(n.keyVar, item.AsList().Get(0))
		child.set(n.valVar, item.AsList().Get(1))
		return
	}
	child.set(n.valVar, item)
}

func (e *evaluator) execSet(n *setNode) error {
	val, err := e.evalExpr(n.value)
	if err != nil {
		return err
	}

	if n.namespace != "" {
		nsVal, ok := e.scope.get(n.namespace)
		if !ok || !nsVal.IsDict() {
			return fmt.Errorf("set: namespace %q not found or not a dict", n.namespace)
		}
		nsVal.AsDict().Set(n.target, val)
		return nil
	}

	if targets := strings.Split(n.target, ","); len(targets) > 1 {
		if !val.IsList() || val.AsList().Len() != len(targets) {
			return fmt.Errorf("set: unpacking requires %d values", len(targets))
		}
		for i, target := range targets {
			e.scope.set(strings.TrimSpace(target), val.AsList().Get(i))
		}
	} else {
		e.scope.set(n.target, val)
	}
	return nil
}

func (e *evaluator) execSetBlock(n *setBlockNode) error {
	bodyEval := evaluator{
		scope:    e.scope,
		builtins: e.builtins,
	}
	if err := bodyEval.execNodes(n.body); err != nil {
		return err
	}
	e.scope.set(n.target, NewString(bodyEval.output.String()))
	return nil
}

func (e *evaluator) execMacro(n *macroNode) error {
	// Capture the macro body and params.
	params := n.params
	body := n.body
	parentScope := e.scope
	acceptsKwargs := referencesName("kwargs", body...)

	fn := NewCallable(n.name, func(args []Value, kwargs map[string]Value) (Value, error) {
		child := newScope(parentScope)

		// Bind positional args.
		for i, param := range params {
			if i < len(args) {
				if _, duplicate := kwargs[param.name]; duplicate {
					return Undefined(), fmt.Errorf("macro %s: multiple values for argument %q", n.name, param.name)
				}
				child.set(param.name, args[i])
			} else if v, ok := kwargs[param.name]; ok {
				child.set(param.name, v)
			} else if param.defaultVal != nil {
				defEval := evaluator{scope: child, builtins: e.builtins}
				defVal, err := defEval.evalExpr(param.defaultVal)
				if err != nil {
					return Undefined(), err
				}
				child.set(param.name, defVal)
			} else {
				child.set(param.name, Undefined())
			}
		}
		extra := NewDict()
		for key, value := range kwargs {
			if _, bound := child.vars[key]; !bound {
				if !acceptsKwargs && key != "caller" {
					return Undefined(), fmt.Errorf("macro %s: unexpected keyword argument %q", n.name, key)
				}
				extra.AsDict().Set(key, value)
			}
		}
		varargs := NewList(args[min(len(args), len(params)):])
		varargs.AsList().tuple = true
		child.set("varargs", varargs)
		child.set("kwargs", extra)

		// Set caller if available.
		if caller, ok := kwargs["caller"]; ok {
			child.set("caller", caller)
		}

		macroEval := evaluator{
			scope:    child,
			builtins: e.builtins,
		}

		if err := macroEval.execNodes(body); err != nil {
			return Undefined(), err
		}

		return NewString(macroEval.output.String()), nil
	})

	e.scope.set(n.name, fn)
	return nil
}

func (e *evaluator) execCall(n *callNode) error {
	// Create a caller callable that renders the body.
	callerArgs := n.callerArgs
	body := n.body
	parentScope := e.scope

	caller := NewCallable("caller", func(args []Value, kwargs map[string]Value) (Value, error) {
		child := newScope(parentScope)
		for i, argName := range callerArgs {
			if i < len(args) {
				child.set(argName, args[i])
			}
		}

		callerEval := evaluator{
			scope:    child,
			builtins: e.builtins,
		}
		if err := callerEval.execNodes(body); err != nil {
			return Undefined(), err
		}
		return NewString(callerEval.output.String()), nil
	})

	// Evaluate the call expression with caller in kwargs.
	callEx, ok := n.expr.(*callExpr)
	if ok {
		fn, err := e.evalExpr(callEx.fn)
		if err != nil {
			return err
		}
		if !fn.IsCallable() {
			return fmt.Errorf("call: expression is not callable")
		}

		var args []Value
		for _, a := range callEx.args {
			av, err := e.evalExpr(a)
			if err != nil {
				return err
			}
			args = append(args, av)
		}

		kwargs, _, err := e.evalKeywordArgs(callEx.kwargs)
		if err != nil {
			return err
		}
		if kwargs == nil {
			kwargs = make(map[string]Value)
		}
		if _, ok := kwargs["caller"]; !ok {
			kwargs["caller"] = caller
		}

		result, err := fn.AsCallable().Fn(args, kwargs)
		if err != nil {
			return err
		}
		e.output.WriteString(printValue(result))
		return nil
	}

	// Fallback: evaluate expression and call with caller.
	fn, err := e.evalExpr(n.expr)
	if err != nil {
		return err
	}
	if !fn.IsCallable() {
		return fmt.Errorf("call: expression is not callable")
	}

	result, err := fn.AsCallable().Fn(nil, map[string]Value{"caller": caller})
	if err != nil {
		return err
	}
	e.output.WriteString(printValue(result))
	return nil
}

func (e *evaluator) execFilterBlock(n *filterBlockNode) error {
	// Render body to string.
	bodyEval := evaluator{
		scope:    newScope(e.scope),
		builtins: e.builtins,
	}
	if err := bodyEval.execNodes(n.body); err != nil {
		return err
	}
	bodyStr := bodyEval.output.String()
	bodyEval.scope.set("__filter_body", NewString(bodyStr))
	result, err := bodyEval.evalExpr(n.filter)
	if err != nil {
		return err
	}
	e.output.WriteString(printValue(result))
	return nil
}

// =============================================================================
// Expression evaluation
// =============================================================================

func (e *evaluator) evalExpr(ex expr) (Value, error) {
	switch n := ex.(type) {
	case *litExpr:
		return n.val, nil

	case *nameExpr:
		v, _ := e.scope.get(n.name)
		return v, nil

	case *attrExpr:
		return e.evalAttr(n)

	case *itemExpr:
		return e.evalItem(n)

	case *sliceExpr:
		return e.evalSlice(n)

	case *unaryExpr:
		return e.evalUnary(n)

	case *binExpr:
		return e.evalBinary(n)

	case *compareExpr:
		left, err := e.evalExpr(n.operands[0])
		if err != nil {
			return Undefined(), err
		}
		for i, op := range n.ops {
			right, err := e.evalExpr(n.operands[i+1])
			if err != nil {
				return Undefined(), err
			}
			result, err := e.evalBinary(&binExpr{op: op, left: &litExpr{val: left}, right: &litExpr{val: right}})
			if err != nil || !result.IsTruthy() {
				return result, err
			}
			left = right
		}
		return NewBool(true), nil

	case *condExpr:
		return e.evalCond(n)

	case *callExpr:
		return e.evalCallExpr(n)

	case *filterExpr:
		return e.evalFilter(n)

	case *testExpr:
		return e.evalTestExpr(n)

	case *listExpr:
		items := make([]Value, len(n.items))
		for i, item := range n.items {
			v, err := e.evalExpr(item)
			if err != nil {
				return Undefined(), err
			}
			items[i] = v
		}
		value := NewList(items)
		value.AsList().tuple = n.tuple
		return value, nil

	case *dictExpr:
		d := NewDict()
		dict := d.AsDict()
		for _, pair := range n.pairs {
			key, err := e.evalExpr(pair.key)
			if err != nil {
				return Undefined(), err
			}
			val, err := e.evalExpr(pair.value)
			if err != nil {
				return Undefined(), err
			}
			dict.Set(printValue(key), val)
		}
		return d, nil

	default:
		return Undefined(), fmt.Errorf("unknown expression type %T", ex)
	}
}

func (e *evaluator) evalAttr(n *attrExpr) (Value, error) {
	obj, err := e.evalExpr(n.obj)
	if err != nil {
		return Undefined(), err
	}

	// Dict attribute access.
	if obj.IsDict() {
		method, err := e.dictMethod(obj, n.attr)
		if err != nil || !method.IsUndefined() {
			return method, err
		}
		if v, ok := obj.AsDict().Get(n.attr); ok {
			return v, nil
		}

		// Dict methods.
		return e.dictMethod(obj, n.attr)
	}

	// String methods.
	if obj.IsString() {
		return e.stringMethod(obj, n.attr)
	}

	// List methods.
	if obj.IsList() {
		if idx, err := strconv.Atoi(n.attr); err == nil && idx >= 0 && idx < obj.AsList().Len() {
			return obj.AsList().Get(idx), nil
		}
		return e.listMethod(obj, n.attr)
	}

	return Undefined(), nil
}

func (e *evaluator) evalItem(n *itemExpr) (Value, error) {
	obj, err := e.evalExpr(n.obj)
	if err != nil {
		return Undefined(), err
	}

	key, err := e.evalExpr(n.key)
	if err != nil {
		return Undefined(), err
	}

	if obj.IsList() {
		if !key.IsInt() && !key.IsBool() {
			return Undefined(), nil
		}
		idx := int(toInt64(key))
		list := obj.AsList()
		if idx < 0 {
			idx += list.Len()
		}
		if idx < 0 || idx >= list.Len() {
			return Undefined(), nil
		}
		return list.Get(idx), nil
	}

	if obj.IsDict() {
		k := printValue(key)
		if v, ok := obj.AsDict().Get(k); ok {
			return v, nil
		}
		return Undefined(), nil
	}

	if obj.IsString() {
		if !key.IsInt() && !key.IsBool() {
			return Undefined(), nil
		}
		idx := int(toInt64(key))
		s := obj.AsString()
		runes := []rune(s)
		if idx < 0 {
			idx += len(runes)
		}
		if idx < 0 || idx >= len(runes) {
			return Undefined(), nil
		}
		return NewString(string(runes[idx])), nil
	}

	return Undefined(), nil
}

func (e *evaluator) evalSlice(n *sliceExpr) (Value, error) {
	obj, err := e.evalExpr(n.obj)
	if err != nil {
		return Undefined(), err
	}
	length := 0
	switch {
	case obj.IsList():
		length = obj.AsList().Len()
	case obj.IsString():
		length = utf8.RuneCountInString(obj.AsString())
	default:
		return Undefined(), nil
	}
	start, stop, step, err := resolveSlice(n, e, length)
	if errors.Is(err, errSliceIndex) && constantExpr(n.obj) && constantExpr(n.start) && constantExpr(n.stop) && constantExpr(n.step) {
		// Jinja constant-folds through getitem, which converts TypeError to
		// undefined. Runtime slices instead propagate invalid index errors.
		return Undefined(), nil
	}
	if err != nil {
		return Undefined(), err
	}

	if obj.IsList() {
		list := obj.AsList()

		// Fast path for the overwhelmingly common step==1 case
		// (e.g. messages[1:] in chat templates). A single allocation
		// of the exact size avoids the geometric growth of append.
		// Aliasing the source slice would be unsafe because List.Append
		// could later mutate beyond Len() into the backing array.
		if step == 1 {
			if start < 0 {
				start = 0
			}
			if stop > length {
				stop = length
			}
			if start >= stop {
				result := NewList(nil)
				result.AsList().tuple = list.tuple
				return result, nil
			}
			items := make([]Value, stop-start)
			copy(items, list.Items[start:stop])
			result := NewList(items)
			result.AsList().tuple = list.tuple
			return result, nil
		}

		var items []Value
		if step > 0 {
			// Pre-size to the maximum possible iteration count to
			// avoid append's geometric growth allocations.
			count := (stop - start + step - 1) / step
			if count > 0 {
				items = make([]Value, 0, count)
			}
			for i := start; i < stop; i += step {
				if i >= 0 && i < length {
					items = append(items, list.Items[i])
				}
			}
		} else if step < 0 {
			count := (start - stop - step - 1) / -step
			if count > 0 {
				items = make([]Value, 0, count)
			}
			for i := start; i > stop; i += step {
				if i >= 0 && i < length {
					items = append(items, list.Items[i])
				}
			}
		}
		result := NewList(items)
		result.AsList().tuple = list.tuple
		return result, nil
	}

	if obj.IsString() {
		s := obj.AsString()

		// ASCII fast path. Most chat-template string slicing operates
		// on tag/role names or message content that is ASCII; for those
		// we can index by byte and skip the []rune conversion entirely.
		// This is the dominant cost in the kronk dense profile because
		// the system prompt can be tens of thousands of bytes.
		if isASCII(s) {

			if step == 1 {
				if start < 0 {
					start = 0
				}
				if stop > length {
					stop = length
				}
				if start >= stop {
					return NewString(""), nil
				}
				return NewString(s[start:stop]), nil
			}

			if step == -1 {
				if start >= length {
					start = length - 1
				}
				if stop < -1 {
					stop = -1
				}
				if start <= stop {
					return NewString(""), nil
				}
				buf := make([]byte, 0, start-stop)
				for i := start; i > stop; i-- {
					buf = append(buf, s[i])
				}
				return NewString(string(buf)), nil
			}
			// Fall through to the general path for unusual steps.
		}

		runes := []rune(s)
		var result []rune
		if step > 0 {
			for i := start; i < stop; i += step {
				if i >= 0 && i < length {
					result = append(result, runes[i])
				}
			}
		} else if step < 0 {
			for i := start; i > stop; i += step {
				if i >= 0 && i < length {
					result = append(result, runes[i])
				}
			}
		}
		return NewString(string(result)), nil
	}

	return Undefined(), nil
}

// isASCII reports whether s contains only 7-bit ASCII bytes. Used to
// skip the []rune conversion in evalSlice's string branch when byte
// indexing produces the same result as code-point indexing.
func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func resolveSlice(n *sliceExpr, e *evaluator, length int) (int, int, int, error) {
	var indices [3]int
	var provided [3]bool
	valid := true
	for i, ex := range [3]expr{n.start, n.stop, n.step} {
		if ex != nil {
			v, err := e.evalExpr(ex)
			if err != nil {
				return 0, 0, 0, err
			}
			if !v.IsNone() && !v.IsInt() && !v.IsBool() {
				valid = false
			}
			if !v.IsNone() {
				provided[i] = true
				indices[i] = int(toInt64(v))
			}
		}
	}
	if !valid {
		return 0, 0, 0, errSliceIndex
	}
	step := 1
	if provided[2] {
		step = indices[2]
	}
	if step == 0 {
		return 0, 0, 0, fmt.Errorf("slice step must not be zero")
	}
	low, high := 0, length
	start, stop := 0, length
	if step < 0 {
		low, high = -1, length-1
		start, stop = high, low
	}
	for i, target := range []*int{&start, &stop} {
		if provided[i] {
			index := indices[i]
			if index < 0 {
				index += length
			}
			*target = min(max(index, low), high)
		}
	}
	return start, stop, step, nil
}

func constantExpr(ex expr) bool {
	switch n := ex.(type) {
	case nil, *litExpr:
		return true
	case *unaryExpr:
		return constantExpr(n.operand)
	case *binExpr:
		return constantExpr(n.left) && constantExpr(n.right)
	case *listExpr:
		for _, item := range n.items {
			if !constantExpr(item) {
				return false
			}
		}
		return true
	}
	return false
}

func (e *evaluator) evalUnary(n *unaryExpr) (Value, error) {
	operand, err := e.evalExpr(n.operand)
	if err != nil {
		return Undefined(), err
	}

	if operand.IsBigInt() && n.op != "not" {
		return Undefined(), errBigInt(n.op)
	}
	switch n.op {
	case "not":
		return NewBool(!operand.IsTruthy()), nil
	case "-":
		if operand.IsBool() {
			return NewInt(-toInt64(operand)), nil
		}
		if operand.IsInt() {
			return NewInt(-operand.AsInt()), nil
		}
		if operand.IsFloat() {
			return NewFloat(-operand.AsFloat()), nil
		}
		return NewInt(0), nil
	case "+":
		if operand.IsBool() {
			return NewInt(toInt64(operand)), nil
		}
		return operand, nil
	}

	return Undefined(), fmt.Errorf("unknown unary operator %q", n.op)
}

func (e *evaluator) evalBinary(n *binExpr) (Value, error) {
	// Short-circuit for and/or.
	if n.op == "and" {
		left, err := e.evalExpr(n.left)
		if err != nil {
			return Undefined(), err
		}
		if !left.IsTruthy() {
			return left, nil
		}
		return e.evalExpr(n.right)
	}

	if n.op == "or" {
		left, err := e.evalExpr(n.left)
		if err != nil {
			return Undefined(), err
		}
		if left.IsTruthy() {
			return left, nil
		}
		return e.evalExpr(n.right)
	}

	left, err := e.evalExpr(n.left)
	if err != nil {
		return Undefined(), err
	}

	right, err := e.evalExpr(n.right)
	if err != nil {
		return Undefined(), err
	}
	if left.IsBigInt() || right.IsBigInt() {
		switch n.op {
		case "==", "!=", "~", "in", "not in":
		default:
			return Undefined(), errBigInt(n.op)
		}
	}

	switch n.op {
	case "+":
		return addValues(left, right), nil
	case "-":
		return subValues(left, right), nil
	case "*":
		return mulValues(left, right)
	case "/":
		return divValues(left, right), nil
	case "//":
		return floorDivValues(left, right), nil
	case "%":
		if left.IsString() {
			var args []any
			if right.IsList() && right.AsList().tuple {
				for _, item := range right.AsList().Items {
					args = append(args, item.v)
				}
			} else {
				args = []any{right.v}
			}
			// Python's decimal integer conversion truncates float arguments. Walk
			// conversions so mixed integer/float formats and escaped %% retain
			// their original argument positions and types.
			format := left.AsString()
			arg := 0
			for i := 0; i < len(format); i++ {
				if format[i] != '%' {
					continue
				}
				i++
				if i < len(format) && format[i] == '%' {
					continue
				}
				for i < len(format) && strings.ContainsRune("#0- +0123456789.*hlL", rune(format[i])) {
					if format[i] == '*' {
						arg++
					}
					i++
				}
				if i < len(format) && format[i] == 'd' && arg < len(args) {
					if value, ok := args[arg].(float64); ok {
						args[arg] = int64(value)
					}
				}
				arg++
			}
			return NewString(fmt.Sprintf(left.AsString(), args...)), nil
		}
		return modValues(left, right), nil
	case "**":
		return powValues(left, right), nil
	case "~":
		return NewString(printValue(left) + printValue(right)), nil
	case "==":
		return NewBool(left.Equals(right)), nil
	case "!=":
		return NewBool(!left.Equals(right)), nil
	case "<":
		order, ordered := compareValues(left, right)
		return NewBool(ordered && order < 0), nil
	case ">":
		order, ordered := compareValues(left, right)
		return NewBool(ordered && order > 0), nil
	case "<=":
		order, ordered := compareValues(left, right)
		return NewBool(ordered && order <= 0), nil
	case ">=":
		order, ordered := compareValues(left, right)
		return NewBool(ordered && order >= 0), nil
	case "in":
		return NewBool(containsValue(right, left)), nil
	case "not in":
		return NewBool(!containsValue(right, left)), nil
	}

	return Undefined(), fmt.Errorf("unknown binary operator %q", n.op)
}

func (e *evaluator) evalCond(n *condExpr) (Value, error) {
	cond, err := e.evalExpr(n.condition)
	if err != nil {
		return Undefined(), err
	}

	if cond.IsTruthy() {
		return e.evalExpr(n.trueExpr)
	}

	if n.falseExpr != nil {
		return e.evalExpr(n.falseExpr)
	}

	return Undefined(), nil
}

func (e *evaluator) evalCallExpr(n *callExpr) (Value, error) {
	fn, err := e.evalExpr(n.fn)
	if err != nil {
		return Undefined(), err
	}

	if fn.IsDict() {
		if call, ok := fn.AsDict().Get("__call__"); ok {
			fn = call
		}
	}
	if !fn.IsCallable() {
		return Undefined(), fmt.Errorf("%s is not callable: %s", callableName(n.fn), fn.String())
	}

	args := make([]Value, len(n.args))
	for i, a := range n.args {
		v, err := e.evalExpr(a)
		if err != nil {
			return Undefined(), err
		}
		args[i] = v
	}

	kwargs, keys, err := e.evalKeywordArgs(n.kwargs)
	if err != nil {
		return Undefined(), err
	}

	if fn.AsCallable().Name == "dict" {
		value, err := fn.AsCallable().Fn(args, nil)
		if err != nil {
			return Undefined(), err
		}
		for _, key := range keys {
			value.AsDict().Set(key, kwargs[key])
		}
		return value, nil
	}
	return fn.AsCallable().Fn(args, kwargs)
}

func (e *evaluator) evalKeywordArgs(keywords []kwarg) (map[string]Value, []string, error) {
	if len(keywords) == 0 {
		return nil, nil, nil
	}
	kwargs := make(map[string]Value, len(keywords))
	var keys []string
	for _, kw := range keywords {
		v, err := e.evalExpr(kw.value)
		if err != nil {
			return nil, nil, err
		}
		if kw.name != "" {
			if _, exists := kwargs[kw.name]; exists {
				return nil, nil, fmt.Errorf("duplicate keyword argument: %s", kw.name)
			}
			kwargs[kw.name] = v
			keys = append(keys, kw.name)
			continue
		}
		if !v.IsDict() {
			return nil, nil, fmt.Errorf("keyword argument expansion requires a mapping")
		}
		for _, key := range v.AsDict().Keys {
			if _, exists := kwargs[key]; exists {
				return nil, nil, fmt.Errorf("duplicate keyword argument: %s", key)
			}
			kwargs[key] = v.AsDict().Data[key]
			keys = append(keys, key)
		}
	}
	return kwargs, keys, nil
}

func callableName(ex expr) string {
	switch n := ex.(type) {
	case *nameExpr:
		return n.name

	case *attrExpr:
		return callableName(n.obj) + "." + n.attr

	case *itemExpr:
		return callableName(n.obj) + "[item]"

	default:
		return ex.nodeType()
	}
}

func (e *evaluator) evalFilter(n *filterExpr) (Value, error) {
	input, err := e.evalExpr(n.expr)
	if err != nil {
		return Undefined(), err
	}

	// Look up filter in builtins.
	filterVal, ok := lookupFilter(e.builtins, n.name)
	if !ok {
		// Also check scope for user-defined filters.
		filterVal, ok = e.scope.get(n.name)
		if !ok {
			return Undefined(), fmt.Errorf("unknown filter %q", n.name)
		}
	}

	if !filterVal.IsCallable() {
		return Undefined(), fmt.Errorf("filter %q is not callable", n.name)
	}
	if err := bigIntFilterGuard(n.name, input); err != nil {
		return Undefined(), err
	}

	// Build args: input as first, then additional args.
	args := make([]Value, 1+len(n.args))
	args[0] = input
	for i, a := range n.args {
		v, err := e.evalExpr(a)
		if err != nil {
			return Undefined(), err
		}
		args[i+1] = v
	}

	kwargs, _, err := e.evalKeywordArgs(n.kwargs)
	if err != nil {
		return Undefined(), err
	}

	return filterVal.AsCallable().Fn(args, kwargs)
}

func (e *evaluator) evalTestExpr(n *testExpr) (Value, error) {
	val, err := e.evalExpr(n.expr)
	if err != nil {
		return Undefined(), err
	}

	var testArgs []Value
	for _, a := range n.args {
		v, err := e.evalExpr(a)
		if err != nil {
			return Undefined(), err
		}
		testArgs = append(testArgs, v)
	}

	result, err := evalTest(n.name, val, testArgs)
	if err != nil {
		return Undefined(), err
	}

	if n.negated {
		result = !result
	}

	return NewBool(result), nil
}

// =============================================================================
// String methods
// =============================================================================

func (e *evaluator) stringMethod(obj Value, method string) (Value, error) {
	s := obj.AsString()

	switch method {
	case "strip":
		return e.makeStringFunc("strip", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) > 0 && !args[0].IsNone() {
				return NewString(strings.Trim(s, printValue(args[0]))), nil
			}
			return NewString(strings.TrimFunc(s, pythonWhitespace)), nil
		}), nil

	case "lstrip":
		return e.makeStringFunc("lstrip", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) > 0 && !args[0].IsNone() {
				return NewString(strings.TrimLeft(s, printValue(args[0]))), nil
			}
			return NewString(strings.TrimLeftFunc(s, pythonWhitespace)), nil
		}), nil

	case "rstrip":
		return e.makeStringFunc("rstrip", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) > 0 && !args[0].IsNone() {
				return NewString(strings.TrimRight(s, printValue(args[0]))), nil
			}
			return NewString(strings.TrimRightFunc(s, pythonWhitespace)), nil
		}), nil

	case "split":
		return e.makeStringFunc("split", func(args []Value, kwargs map[string]Value) (Value, error) {
			maxsplit := -1
			if len(args) > 1 {
				maxsplit = int(toInt64(args[1]))
			}
			var parts []string
			if len(args) == 0 || args[0].IsNone() {
				rest := strings.TrimLeftFunc(s, pythonWhitespace)
				for rest != "" {
					if maxsplit >= 0 && len(parts) == maxsplit {
						parts = append(parts, rest)
						break
					}
					index := strings.IndexFunc(rest, pythonWhitespace)
					if index < 0 {
						parts = append(parts, rest)
						break
					}
					parts = append(parts, rest[:index])
					rest = strings.TrimLeftFunc(rest[index:], pythonWhitespace)
				}
			} else {
				sep := printValue(args[0])
				if sep == "" {
					return Undefined(), fmt.Errorf("split: empty separator")
				}
				n := -1
				if maxsplit >= 0 {
					n = maxsplit + 1
				}
				parts = strings.SplitN(s, sep, n)
			}
			items := make([]Value, len(parts))
			for i, p := range parts {
				items[i] = NewString(p)
			}
			return NewList(items), nil
		}), nil

	case "startswith", "endswith", "count", "find":
		return e.makeStringFunc(method, func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) == 0 {
				return Undefined(), fmt.Errorf("%s requires an argument", method)
			}
			runes := []rune(s)
			start, end := 0, len(runes)
			if len(args) > 1 && !args[1].IsNone() {
				start = int(toInt64(args[1]))
				if start < 0 {
					start += len(runes)
				}
				start = max(start, 0)
			}
			if len(args) > 2 && !args[2].IsNone() {
				end = int(toInt64(args[2]))
				if end < 0 {
					end += len(runes)
				}
				end = min(max(end, 0), len(runes))
			}
			valid := start <= end
			part := ""
			if valid {
				part = string(runes[start:end])
			}
			switch method {
			case "startswith", "endswith":
				patterns := []Value{args[0]}
				if args[0].IsList() && args[0].AsList().tuple {
					patterns = args[0].AsList().Items
				}
				for _, pattern := range patterns {
					if valid && ((method == "startswith" && strings.HasPrefix(part, printValue(pattern))) || (method == "endswith" && strings.HasSuffix(part, printValue(pattern)))) {
						return NewBool(true), nil
					}
				}
				return NewBool(false), nil
			case "count":
				if !valid {
					return NewInt(0), nil
				}
				return NewInt(int64(strings.Count(part, printValue(args[0])))), nil
			default:
				index := strings.Index(part, printValue(args[0]))
				if !valid || index < 0 {
					return NewInt(-1), nil
				}
				return NewInt(int64(start + utf8.RuneCountInString(part[:index]))), nil
			}
		}), nil

	case "replace":
		return e.makeStringFunc("replace", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) < 2 {
				return NewString(s), nil
			}
			old := printValue(args[0])
			newStr := printValue(args[1])
			count := -1
			if len(args) > 2 {
				count = int(toInt64(args[2]))
			}
			return NewString(strings.Replace(s, old, newStr, count)), nil
		}), nil

	// kvexact: Python's str.upper, lower, title and capitalize (pystr.go).
	case "upper":
		return e.makeStringFunc("upper", func(args []Value, kwargs map[string]Value) (Value, error) {
			return NewString(pyUpper(s)), nil
		}), nil

	case "lower":
		return e.makeStringFunc("lower", func(args []Value, kwargs map[string]Value) (Value, error) {
			return NewString(pyLower(s)), nil
		}), nil

	case "title":
		return e.makeStringFunc("title", func(args []Value, kwargs map[string]Value) (Value, error) {
			return NewString(pyTitle(s)), nil
		}), nil

	case "capitalize":
		return e.makeStringFunc("capitalize", func(args []Value, kwargs map[string]Value) (Value, error) {
			return NewString(pyCapitalize(s)), nil
		}), nil

	case "format":
		return e.makeStringFunc("format", func(args []Value, kwargs map[string]Value) (Value, error) {
			result := s
			for i, arg := range args {
				placeholder := fmt.Sprintf("{%d}", i)
				result = strings.ReplaceAll(result, placeholder, printValue(arg))
				result = strings.Replace(result, "{}", printValue(arg), 1)
			}
			return NewString(result), nil
		}), nil
	}

	return Undefined(), nil
}

func (e *evaluator) makeStringFunc(name string, fn func([]Value, map[string]Value) (Value, error)) Value {
	return NewCallable("str."+name, fn)
}

func pythonWhitespace(r rune) bool {
	return unicode.IsSpace(r) || r >= '\x1c' && r <= '\x1f'
}

// =============================================================================
// List methods
// =============================================================================

func (e *evaluator) listMethod(obj Value, method string) (Value, error) {
	list := obj.AsList()

	switch method {
	case "append":
		return NewCallable("list.append", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) > 0 {
				list.Append(args[0])
			}
			return None(), nil
		}), nil

	case "pop":
		return NewCallable("list.pop", func(args []Value, kwargs map[string]Value) (Value, error) {
			if list.Len() == 0 {
				return Undefined(), fmt.Errorf("pop from empty list")
			}
			idx := list.Len() - 1
			if len(args) > 0 {
				idx = int(toInt64(args[0]))
				if idx < 0 {
					idx += list.Len()
				}
			}
			if idx < 0 || idx >= list.Len() {
				return Undefined(), fmt.Errorf("pop index out of range")
			}
			val := list.Items[idx]
			list.Items = append(list.Items[:idx], list.Items[idx+1:]...)
			return val, nil
		}), nil

	case "insert":
		return NewCallable("list.insert", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) < 2 {
				return None(), nil
			}
			idx := min(max(int(toInt64(args[0])), 0), list.Len())
			list.Items = append(list.Items, Undefined())
			copy(list.Items[idx+1:], list.Items[idx:])
			list.Items[idx] = args[1]
			return None(), nil
		}), nil
	}

	return Undefined(), nil
}

// =============================================================================
// Dict methods
// =============================================================================

func (e *evaluator) dictMethod(obj Value, method string) (Value, error) {
	d := obj.AsDict()

	switch method {
	case "items":
		return NewCallable("dict.items", func(args []Value, kwargs map[string]Value) (Value, error) {
			items := make([]Value, 0, d.Len())
			for _, key := range d.Keys {
				pair := NewList([]Value{NewString(key), d.Data[key]})
				items = append(items, pair)
			}
			return NewList(items), nil
		}), nil

	case "keys":
		return NewCallable("dict.keys", func(args []Value, kwargs map[string]Value) (Value, error) {
			items := make([]Value, 0, d.Len())
			for _, key := range d.Keys {
				items = append(items, NewString(key))
			}
			return NewList(items), nil
		}), nil

	case "values":
		return NewCallable("dict.values", func(args []Value, kwargs map[string]Value) (Value, error) {
			items := make([]Value, 0, d.Len())
			for _, key := range d.Keys {
				items = append(items, d.Data[key])
			}
			return NewList(items), nil
		}), nil

	case "get":
		return NewCallable("dict.get", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) == 0 {
				return Undefined(), nil
			}
			key := printValue(args[0])
			if v, ok := d.Get(key); ok {
				return v, nil
			}
			if len(args) > 1 {
				return args[1], nil
			}
			return None(), nil
		}), nil

	case "pop":
		return NewCallable("dict.pop", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) == 0 {
				return Undefined(), nil
			}
			key := printValue(args[0])
			v, ok := d.Get(key)
			if ok {
				delete(d.Data, key)
				newKeys := make([]string, 0, len(d.Keys)-1)
				for _, k := range d.Keys {
					if k != key {
						newKeys = append(newKeys, k)
					}
				}
				d.Keys = newKeys
				return v, nil
			}
			if len(args) > 1 {
				return args[1], nil
			}
			return Undefined(), nil
		}), nil

	case "update":
		return NewCallable("dict.update", func(args []Value, kwargs map[string]Value) (Value, error) {
			if len(args) > 0 && args[0].IsDict() {
				other := args[0].AsDict()
				for _, key := range other.Keys {
					d.Set(key, other.Data[key])
				}
			}
			return None(), nil
		}), nil
	}

	return Undefined(), nil
}

// =============================================================================
// Arithmetic helpers
// =============================================================================

func addValues(a, b Value) Value {
	if a.IsString() || b.IsString() {
		return NewString(printValue(a) + printValue(b))
	}
	if a.IsList() && b.IsList() {
		items := make([]Value, 0, a.AsList().Len()+b.AsList().Len())
		items = append(items, a.AsList().Items...)
		items = append(items, b.AsList().Items...)
		return NewList(items)
	}
	if a.IsFloat() || b.IsFloat() {
		return NewFloat(toFloat64(a) + toFloat64(b))
	}
	return NewInt(toInt64(a) + toInt64(b))
}

func subValues(a, b Value) Value {
	if a.IsFloat() || b.IsFloat() {
		return NewFloat(toFloat64(a) - toFloat64(b))
	}
	return NewInt(toInt64(a) - toInt64(b))
}

// maxRepeatBytes limits the string bytes or list backing array allocated by a
// single repetition. It does not bound nested values or rendered output.
const maxRepeatBytes = 64 << 20

func mulValues(a, b Value) (Value, error) {
	// Normalize repetition to sequence * count.
	if (a.IsInt() || a.IsBool()) && (b.IsString() || b.IsList()) {
		a, b = b, a
	}
	if (a.IsString() || a.IsList()) && (b.IsInt() || b.IsBool()) {
		count := max(toInt64(b), 0)
		if a.IsString() {
			s := a.AsString()
			if count == 0 || len(s) == 0 {
				return NewString(""), nil
			}
			if count > maxRepeatBytes/int64(len(s)) {
				return Undefined(), fmt.Errorf("repeated string exceeds %d-byte allocation limit", maxRepeatBytes)
			}
			return NewString(strings.Repeat(s, int(count))), nil
		}

		src := a.AsList().Items
		if count == 0 || len(src) == 0 {
			return NewList(nil), nil
		}
		const maxItems = maxRepeatBytes / int(unsafe.Sizeof(Value{}))
		if count > int64(maxItems)/int64(len(src)) {
			return Undefined(), fmt.Errorf("repeated list exceeds %d-byte allocation limit", maxRepeatBytes)
		}
		items := make([]Value, len(src)*int(count))
		for i := range int(count) {
			copy(items[i*len(src):], src)
		}
		return NewList(items), nil
	}
	if a.IsFloat() || b.IsFloat() {
		return NewFloat(toFloat64(a) * toFloat64(b)), nil
	}
	return NewInt(toInt64(a) * toInt64(b)), nil
}

func divValues(a, b Value) Value {
	bf := toFloat64(b)
	if bf == 0 {
		return NewFloat(0)
	}
	return NewFloat(toFloat64(a) / bf)
}

func floorDivValues(a, b Value) Value {
	if a.IsFloat() || b.IsFloat() {
		dividend, divisor := toFloat64(a), toFloat64(b)
		remainder := math.Mod(dividend, divisor)
		quotient := (dividend - remainder) / divisor
		if remainder != 0 && math.Signbit(remainder) != math.Signbit(divisor) {
			quotient--
		}
		if quotient == 0 {
			return NewFloat(math.Copysign(0, dividend/divisor))
		}
		floor := math.Floor(quotient)
		if quotient-floor > 0.5 {
			floor++
		}
		return NewFloat(floor)
	}
	bi := toInt64(b)
	if bi == 0 {
		return NewInt(0)
	}
	ai := toInt64(a)
	quotient := ai / bi
	if ai%bi != 0 && (ai < 0) != (bi < 0) {
		quotient--
	}
	return NewInt(quotient)
}

func modValues(a, b Value) Value {
	if a.IsFloat() || b.IsFloat() {
		divisor := toFloat64(b)
		remainder := math.Mod(toFloat64(a), divisor)
		if remainder != 0 && math.Signbit(remainder) != math.Signbit(divisor) {
			remainder += divisor
		}
		if remainder == 0 {
			remainder = math.Copysign(0, divisor)
		}
		return NewFloat(remainder)
	}
	bi := toInt64(b)
	if bi == 0 {
		return NewInt(0)
	}
	remainder := toInt64(a) % bi
	if remainder != 0 && (remainder < 0) != (bi < 0) {
		remainder += bi
	}
	return NewInt(remainder)
}

func powValues(a, b Value) Value {
	f := math.Pow(toFloat64(a), toFloat64(b))
	if (a.IsInt() || a.IsBool()) && (b.IsInt() || b.IsBool()) && toInt64(b) >= 0 && f >= -0x1p63 && f < 0x1p63 {
		result, base, exponent := int64(1), toInt64(a), toInt64(b)
		for exponent > 0 {
			if exponent&1 != 0 {
				result *= base
			}
			exponent >>= 1
			if exponent > 0 {
				base *= base
			}
		}
		return NewInt(result)
	}
	return NewFloat(f)
}

// errBigInt: an operation the engine cannot do exactly on an integer beyond int64 (kvexact).
func errBigInt(op string) error {
	return fmt.Errorf("operator %q on an integer beyond int64 is not reproduced", op)
}

// bigIntFilterGuard refuses filters that would compute with an integer beyond int64 (kvexact):
// those that only print, serialize or pass values along are exact; numeric ones and those that
// order or sum the items of a container are not.
func bigIntFilterGuard(name string, input Value) error {
	switch name {
	case "tojson", "string", "safe", "escape", "e", "default", "d":
		return nil // print or pass the value itself
	case "join", "items", "list", "first", "last", "length", "count", "reverse", "selectattr", "rejectattr", "batch":
		if !input.IsBigInt() {
			return nil // move a container's items around without computing with them
		}
	}
	if containsBigInt(input) {
		return fmt.Errorf("filter %q on an integer beyond int64 is not reproduced", name)
	}
	return nil
}
