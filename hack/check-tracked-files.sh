#!/usr/bin/env bash
# Fails when a tracked file is binary or larger than 1 MiB and hack/large-files.txt does not
# list it with a reason. Binary is git's own test (a NUL byte in the first 8000 bytes, or a
# `binary`/`-diff` attribute). It reads the index, so it checks what the next commit holds
# (on a clean clone, HEAD). Entries of the list that match nothing fail too, so it stays true.
#   hack/check-tracked-files.sh    (run from anywhere in the repository; make verify runs it)
# hack/large-files.txt: one `path  reason` a line; blank lines and lines starting with # skipped.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
list=hack/large-files.txt
limit=${TRACKED_FILE_LIMIT:-1048576}
fail=0
problem() { echo "check-tracked-files: $*" >&2; fail=1; }

# Sets are newline-separated strings (bash 3 has no associative arrays).
nl=$'\n'
has() { case "$nl$1" in *"$nl$2$nl"*) return 0 ;; esac; return 1; }

listed='' used='' binary='' entries=()
if [ -f "$list" ]; then
	n=0
	while IFS= read -r line || [ -n "$line" ]; do
		n=$((n + 1))
		line=${line%$'\r'}
		read -r path why <<<"$line"
		case $path in '' | '#'*) continue ;; esac
		if [ -z "$why" ]; then
			problem "$list:$n: $path has no reason"
			continue
		fi
		listed+="$path$nl"
		entries+=("$path")
	done <"$list"
fi

# Binary files show as "-<TAB>-<TAB>path" in a numstat against the empty tree.
empty=$(git hash-object -t tree /dev/null)
while IFS= read -r -d '' rec; do
	[ "${rec%%$'\t'*}" != - ] || binary+="${rec#*$'\t'*$'\t'}$nl"
done < <(git diff --cached --numstat -z --no-renames --no-ext-diff --no-textconv "$empty")

# Sizes of the staged blobs (submodules have none).
paths=() blobs=() sizes=()
while IFS= read -r -d '' rec; do
	read -r mode blob _ <<<"${rec%%$'\t'*}"
	[ "$mode" = 160000 ] && continue
	paths+=("${rec#*$'\t'}")
	blobs+=("$blob")
done < <(git ls-files -z -s)
if [ ${#blobs[@]} -gt 0 ]; then
	while IFS= read -r size; do sizes+=("$size"); done < <(printf '%s\n' "${blobs[@]}" | git cat-file --batch-check='%(objectsize)')
fi

i=0
while [ "$i" -lt ${#paths[@]} ]; do
	path=${paths[i]} size=${sizes[i]} what=
	i=$((i + 1))
	! has "$binary" "$path" || what="binary"
	[ "$size" -le "$limit" ] || what="${what:+$what, }$size bytes (over $limit)"
	[ -n "$what" ] || continue
	if has "$listed" "$path"; then
		used+="$path$nl"
	else
		problem "$path: $what: remove it from git (and ignore it in .gitignore) or list it in $list with a reason"
	fi
done
for path in ${entries[@]+"${entries[@]}"}; do
	has "$used" "$path" || problem "$list lists $path, which is not a tracked binary or large file: remove the line"
done
exit "$fail"
