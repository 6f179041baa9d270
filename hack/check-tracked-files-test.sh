#!/usr/bin/env bash
# Tests hack/check-tracked-files.sh in throwaway repositories: it must pass clean ones and fail
# on each kind of problem, naming it. make verify runs it (a few seconds); failures only are printed.
set -euo pipefail
check="$(cd "$(dirname "$0")" && pwd)/check-tracked-files.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE
failed=0

# expect pass|fail NAME SETUP: SETUP runs in a fresh repository holding hack/large-files.txt,
# then everything is staged and the check must pass or fail (and then name the problem).
n=0
expect() {
	local want=$1 name=$2 setup=$3 dir rc=0
	n=$((n + 1))
	dir="$tmp/$n"
	mkdir -p "$dir/hack"
	git -C "$dir" init -q
	echo "# path  reason" >"$dir/hack/large-files.txt"
	(cd "$dir" && eval "$setup" && git add -A) || { echo "FAIL $name: setup failed"; failed=1; return; }
	(cd "$dir/hack" && "$check") >"$dir.out" 2>&1 || rc=$?
	case $want/$rc in
	pass/0) ;;
	fail/1) if grep -q "$4" "$dir.out"; then :; else echo "FAIL $name: output lacks '$4':"; cat "$dir.out"; failed=1; fi ;;
	*) echo "FAIL $name: want $want, exit $rc:"; cat "$dir.out"; failed=1 ;;
	esac
}

expect pass "text files" 'echo hi >a.txt; : >empty; mkdir d; printf "x\n" >"d/with space.go"'
expect fail "a binary file" 'printf "ELF\0\1\2" >launch' 'launch: binary'
expect fail "a binary in a folder with a space" 'mkdir "x y"; printf "\0" >"x y/z"' 'x y/z: binary'
expect pass "a listed binary" 'printf "\0" >blob; echo "blob  fixture for the parser" >>hack/large-files.txt'
expect fail "a listed binary without a reason" 'printf "\0" >blob; echo "blob" >>hack/large-files.txt' 'blob has no reason'
expect fail "a text file over 1 MiB" 'head -c 1048577 /dev/zero | tr "\0" a >big.txt' 'big.txt: 1048577 bytes'
expect pass "a text file of exactly 1 MiB" 'head -c 1048576 /dev/zero | tr "\0" a >big.txt'
expect pass "a listed large file" 'head -c 1048577 /dev/zero | tr "\0" a >big.txt; echo "big.txt  generated, kept for review" >>hack/large-files.txt'
expect fail "a stale entry" 'echo "gone  was a fixture" >>hack/large-files.txt' 'lists gone'
expect fail "an entry for a small text file" 'echo hi >a.txt; echo "a.txt  no longer binary" >>hack/large-files.txt' 'lists a.txt'
expect fail "binary by attribute" 'echo hi >a.dat; echo "*.dat binary" >.gitattributes' 'a.dat: binary'

[ "$failed" = 0 ] && echo "check-tracked-files-test: $n cases ok"
exit "$failed"
