package controllers

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The core reads one way: Reconcile's file calls down into the pass's steps, which call the
// helpers below them, and no file of this package uses a name declared in a file that uses it
// back, directly or round a loop (docs/design/architecture.md). A loop means a concern's file
// reaches back up into the file that drives it: move the shared name down instead.
func TestTheCoresFilesUseEachOtherOneWay(t *testing.T) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	if len(files) < 10 {
		t.Fatalf("read %d files of the package", len(files))
	}
	// Only this package's own names matter: other packages stay unresolved (their errors are
	// expected and ignored), which keeps the test quick and free of a build of the imports.
	conf := types.Config{
		Importer: fakeImporter{},
		Error:    func(error) {},
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
	pkg, _ := conf.Check("controllers", fset, files, info)
	fileOf := func(p token.Pos) string { return filepath.Base(fset.Position(p).Filename) }
	uses := map[string]map[string][]string{} // file → the files whose names it uses → the names
	note := func(at token.Pos, obj types.Object) {
		if obj == nil || obj.Pkg() != pkg || !obj.Pos().IsValid() {
			return
		}
		if _, ok := obj.(*types.Func); !ok && obj.Parent() != pkg.Scope() && !isField(obj) {
			return // a local: only functions, methods, fields and package-level names tie files
		}
		from, to := fileOf(at), fileOf(obj.Pos())
		if from == to {
			return
		}
		if uses[from] == nil {
			uses[from] = map[string][]string{}
		}
		if !slices.Contains(uses[from][to], obj.Name()) {
			uses[from][to] = append(uses[from][to], obj.Name())
		}
	}
	for id, obj := range info.Uses {
		note(id.Pos(), obj)
	}
	for _, cycle := range fileCycles(uses) {
		var b strings.Builder
		for i, f := range cycle {
			next := cycle[(i+1)%len(cycle)]
			b.WriteString("\n  " + f + " uses " + next + "'s " + strings.Join(uses[f][next], ", "))
		}
		t.Errorf("these files use each other round a loop:%s", b.String())
	}
	if _, err := os.Stat("zayatrainingjob_controller.go"); err != nil || len(uses["zayatrainingjob_controller.go"]) < 5 {
		t.Errorf("Reconcile's file uses %d others: the reading of uses is broken", len(uses["zayatrainingjob_controller.go"]))
	}
}

func isField(obj types.Object) bool {
	v, ok := obj.(*types.Var)
	return ok && v.IsField()
}

// fakeImporter gives every import an empty, complete package: names from it stay unresolved.
type fakeImporter struct{}

func (fakeImporter) Import(path string) (*types.Package, error) {
	p := types.NewPackage(path, filepath.Base(path))
	p.MarkComplete()
	return p, nil
}

// fileCycles finds the loops in the graph of uses: one per strongly connected set of files,
// as a path round it.
func fileCycles(uses map[string]map[string][]string) [][]string {
	var nodes []string
	for f := range uses {
		nodes = append(nodes, f)
	}
	slices.Sort(nodes)
	index, low := map[string]int{}, map[string]int{}
	var stack []string
	on := map[string]bool{}
	var out [][]string
	var visit func(v string)
	visit = func(v string) {
		index[v], low[v] = len(index), len(index)
		stack = append(stack, v)
		on[v] = true
		var next []string
		for w := range uses[v] {
			next = append(next, w)
		}
		slices.Sort(next)
		for _, w := range next {
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if on[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] != index[v] {
			return
		}
		var comp []string
		for {
			w := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			on[w] = false
			comp = append(comp, w)
			if w == v {
				break
			}
		}
		if len(comp) > 1 {
			out = append(out, loopThrough(comp, uses))
		}
	}
	for _, v := range nodes {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	return out
}

// loopThrough is a path from the first of comp back to it, within comp (a breadth-first walk).
func loopThrough(comp []string, uses map[string]map[string][]string) []string {
	slices.Sort(comp)
	start := comp[0]
	prev := map[string]string{}
	queue := []string{start}
	for len(queue) > 0 {
		v := queue[0]
		queue = queue[1:]
		var next []string
		for w := range uses[v] {
			next = append(next, w)
		}
		slices.Sort(next)
		for _, w := range next {
			if !slices.Contains(comp, w) {
				continue
			}
			if w == start {
				path := []string{v}
				for path[0] != start {
					path = append([]string{prev[path[0]]}, path...)
				}
				return path
			}
			if _, seen := prev[w]; !seen {
				prev[w] = v
				queue = append(queue, w)
			}
		}
	}
	return comp
}
