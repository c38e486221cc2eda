#!/usr/bin/env bash
# The project's habits, checked: clang-format (.clang-format) on every C++ file of the tree, and
# clang-tidy (.clang-tidy) on the C++ files a change touches. Run by CTest as the test `lint`
# (label lint), so by scripts/test.sh and CI too.
#
#   scripts/lint.sh                       format: the whole tree; clang-tidy: the files changed
#                                         since IDEMKAFKA_LINT_BASE (default: the last commit's
#                                         parent, so in CI the change submitted)
#   scripts/lint.sh --base main           clang-tidy on the files changed since main
#   scripts/lint.sh --all                 clang-tidy on every file in src/ and tools/ too
#   scripts/lint.sh --build-dir DIR       compile_commands.json from DIR (default: build)
#
# The tree: the .cpp and .hpp files git tracks or would track (new files not yet added, not
# ignored ones) under src, include, tests, tools, bench and examples; the project has no
# generated or third-party C++ there, and build directories are ignored.
# clang-tidy reads the compile commands of a build configured with
# CMAKE_EXPORT_COMPILE_COMMANDS=ON (the presets and scripts/test.sh do that). A file without
# a compile command (a header, a file of a target not built) gets the format check only.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
base="${IDEMKAFKA_LINT_BASE:-}"
build_dir="$root/build"
all=0
while [ $# -gt 0 ]; do
    case "$1" in
        --base) base="${2:?--base needs a revision}"; shift 2 ;;
        --all) all=1; shift ;;
        --build-dir) build_dir="${2:?--build-dir needs a directory}"; shift 2 ;;
        *) printf 'lint: unknown argument "%s"\n' "$1" >&2; exit 2 ;;
    esac
done

cd "$root"
for tool in clang-format clang-tidy git; do
    command -v "$tool" >/dev/null || { printf 'lint: %s is not installed (scripts/lib.sh installs it)\n' "$tool" >&2; exit 1; }
done
if ! git rev-parse --git-dir >/dev/null 2>&1; then
    printf 'lint: %s is not a git work tree; nothing to compare with\n' "$root" >&2
    exit 1
fi

paths=(src include tests tools bench examples)
# Tracked and new (untracked, not ignored) files; a tracked file deleted in the work tree is gone.
tree=()
while read -r f; do
    [ -f "$f" ] && tree+=("$f")
done < <(git ls-files --cached --others --exclude-standard -- "${paths[@]}" | grep -E '\.(cpp|hpp)$' | sort -u)
status=0
printf 'lint: clang-format on the whole tree (%d files)\n' "${#tree[@]}"
if [ "${#tree[@]}" -gt 0 ] && ! clang-format --dry-run --Werror "${tree[@]}"; then
    printf 'lint: clang-format would change the files above: run clang-format -i on them\n' >&2
    status=1
fi

if [ "$all" -eq 1 ]; then
    files=("${tree[@]}")
else
    if [ -z "$base" ]; then
        # The last commit's first parent; the empty tree for a repository's first commit.
        base=$(git rev-parse -q --verify HEAD~1 || git hash-object -t tree /dev/null)
    fi
    # Committed and uncommitted changes since base, and new files not yet added.
    mapfile -t files < <({
        git diff --name-only --diff-filter=ACMR "$base" -- "${paths[@]}"
        git ls-files --others --exclude-standard -- "${paths[@]}"
    } | grep -E '\.(cpp|hpp)$' | sort -u || true)
fi
if [ "${#files[@]}" -eq 0 ]; then
    printf 'lint: clang-tidy: no C++ file changed since %s\n' "${base:-the start}"
    exit "$status"
fi
printf 'lint: clang-tidy: %d file(s)%s\n' "${#files[@]}" "${base:+ changed since $base}"

compile_db="$build_dir/compile_commands.json"
if [ ! -f "$compile_db" ]; then
    printf 'lint: %s is missing: configure with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON\n' "$compile_db" >&2
    exit 1
fi
# Translation units of the library and its tools only (the tests' Catch2 macros are not ours)
# that have a compile command. The compile database is read once.
declare -A compiled=()
while read -r f; do
    compiled["$f"]=1
done < <(grep -o '"file": "[^"]*"' "$compile_db" | cut -d'"' -f4)
units=()
for f in "${files[@]}"; do
    if [[ "$f" =~ ^(src|tools)/.*\.cpp$ ]] && [ -n "${compiled["$root/$f"]:-}" ]; then
        units+=("$f")
    fi
done
if [ "${#units[@]}" -gt 0 ]; then
    printf 'lint: clang-tidy on %d file(s)\n' "${#units[@]}"
    # GCC 12 compiles C++17 without a -std flag; clang-tidy's default is older.
    if ! clang-tidy -p "$build_dir" --quiet --extra-arg=-std=c++17 --warnings-as-errors='*' "${units[@]}"; then
        printf 'lint: clang-tidy found the problems above\n' >&2
        status=1
    fi
fi
exit "$status"
