#!/usr/bin/env bash
# The project's habits, checked: clang-format (.clang-format) and clang-tidy (.clang-tidy) on the
# C++ files a change touches. Run by CTest as the test `lint` (label lint), so by
# scripts/test.sh and CI too.
#
#   scripts/lint.sh                       the files changed since IDEMKAFKA_LINT_BASE (default:
#                                         the last commit's parent, so in CI the change submitted)
#   scripts/lint.sh --base main           the files changed since main
#   scripts/lint.sh --all                 every C++ file (clang-tidy: every file in src/ and tools/)
#   scripts/lint.sh --build-dir DIR       compile_commands.json from DIR (default: build)
#
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
if [ "$all" -eq 1 ]; then
    mapfile -t files < <(git ls-files -- "${paths[@]}" | grep -E '\.(cpp|hpp)$' || true)
else
    if [ -z "$base" ]; then
        # The last commit's first parent; the empty tree for a repository's first commit.
        base=$(git rev-parse -q --verify HEAD~1 || git hash-object -t tree /dev/null)
    fi
    mapfile -t files < <(git diff --name-only --diff-filter=ACMR "$base" -- "${paths[@]}" |
        grep -E '\.(cpp|hpp)$' || true)
fi
if [ "${#files[@]}" -eq 0 ]; then
    printf 'lint: no C++ file changed since %s\n' "${base:-the start}"
    exit 0
fi
printf 'lint: %d file(s)%s\n' "${#files[@]}" "${base:+ changed since $base}"

status=0
printf 'lint: clang-format\n'
if ! clang-format --dry-run --Werror "${files[@]}"; then
    printf 'lint: clang-format would change the files above: run clang-format -i on them\n' >&2
    status=1
fi

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
