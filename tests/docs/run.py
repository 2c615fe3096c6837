"""Runs every command the documentation tells people to run, as written, and checks its links.

The commands are the fenced ``sh`` blocks of README.md, python/README.md and docs/*.md, and
the commands in the module docstrings of examples/python/*.py. Each one runs from the
checkout's root under ``bash -e -o pipefail``, and the stage fails when one fails (exit
status, or a block still running after its time limit). tests/docs/README.md gives the
convention: what may be substituted (dataset paths and sizes only), how a document marks
a block that cannot run here and why, and how a Python file a command runs is written.

    .venv/bin/python tests/docs/run.py [--only PATTERN] [--list] [--links-only]
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ["README.md", "python/README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
# A block marked `<!-- docs-test: skip REASON -->` on the line before it is listed as not
# run, with its reason.
SKIP_MARK = re.compile(r"<!--\s*docs-test:\s*skip\s+(.+?)\s*-->")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
# The substitutions (tests/docs/README.md): dataset paths move under the scratch
# directory, sample counts shrink to at most MAX_SAMPLES.
PATHS = re.compile(r"(?<![\w./-])(/data/|/shared/|/tmp/mf-)")
SAMPLES = re.compile(r"--samples (\d+)")
MAX_SAMPLES = 4000
# Docstring commands that need what this machine does not have.
NEEDS = {
    "--device cuda": "needs a GPU",
    "--address auto": "needs a running Ray cluster (tests/emulation/launchers.rs runs one)",
    "sbatch": "needs a Slurm cluster (tests/emulation/slurm.rs runs the scripts)",
}
PROGRAMS = ("python ", "mpirun ", "torchrun ", "meshfeed ", "bash ", "sbatch ", "cargo ")
BLOCK_TIMEOUT_S = 600
# The front door stays short: the rest belongs in docs/.
README_MAX_BYTES = 12_000
# The command that runs this check (README's quickstart names it) is not run again from it.
SELF = "bash tests/ci.sh"


@dataclass
class Block:
    """One runnable unit: a fenced block, or a docstring's command."""

    source: str  # where: file:line
    text: str
    skip: str | None = None
    files: dict[str, str] = field(default_factory=dict)  # Python files the block runs


def substitute(text: str, scratch: Path) -> str:
    text = PATHS.sub(lambda m: f"{scratch}{m.group(1)}", text)
    return SAMPLES.sub(lambda m: f"--samples {min(int(m.group(1)), MAX_SAMPLES)}", text)


def markdown_blocks(doc: str) -> list[Block]:
    """A document's `sh` blocks, with the named Python files (a ```python block whose
    first line is `# NAME.py`) every block of the document may run."""
    lines = (ROOT / doc).read_text().splitlines()
    blocks: list[Block] = []
    files: dict[str, str] = {}
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m.group(2):
            i += 1
            continue
        indent, lang = len(m.group(1)), m.group(2)
        end = i + 1
        while end < len(lines) and not FENCE.match(lines[end]):
            end += 1
        body = [line[indent:] for line in lines[i + 1 : end]]
        before = lines[i - 1] if i > 0 else ""
        skip = SKIP_MARK.search(before)
        if lang == "sh":
            blocks.append(Block(f"{doc}:{i + 1}", "\n".join(body) + "\n", skip.group(1) if skip else None))
        elif lang == "python" and body and (named := re.fullmatch(r"# (\w+\.py)\b.*", body[0])):
            files[named.group(1)] = "\n".join(body) + "\n"
        i = end + 1
    for b in blocks:
        b.files = files
    return blocks


def docstring_blocks(path: Path) -> list[Block]:
    """The commands of an example's module docstring: its indented lines that start with a
    program (continued by a trailing backslash). Usage lines, with capitalised
    placeholders or [optional] parts, are not commands."""
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
    blocks = []
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        start = i
        command = line.strip()
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command[:-1].rstrip() + " " + lines[i].strip()
        i += 1
        if not line.startswith("    ") or not re.match(r"(\w+=\S+ )*(" + "|".join(PROGRAMS) + ")", command):
            continue
        command = re.sub(r"\s+#.*$", "", command)
        words = command.split()
        if "[" in command or any(
            re.fullmatch(r"[A-Z][A-Z_]+", w) and (k == 0 or words[k - 1] != "-x") for k, w in enumerate(words)
        ):
            continue  # a usage line (`-x NAME` passes a variable to mpirun's ranks)
        skip = next((why for what, why in NEEDS.items() if what in command), None)
        rel = path.relative_to(ROOT)
        blocks.append(Block(f"{rel}:docstring line {start + 1}", command + "\n", skip))
    return blocks


def all_blocks() -> list[Block]:
    blocks = [b for doc in DOCUMENTS for b in markdown_blocks(doc)]
    for path in sorted((ROOT / "examples" / "python").glob("*.py")):
        blocks += docstring_blocks(path)
    return blocks


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def check_links() -> list[str]:
    """Relative links of the documents: the file exists, and so does the #anchor."""
    bad = []
    anchors: dict[Path, set[str]] = {}

    def anchors_of(p: Path) -> set[str]:
        if p not in anchors:
            text = re.sub(r"```.*?```", "", p.read_text(), flags=re.S)
            anchors[p] = {slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}
        return anchors[p]

    for doc in DOCUMENTS:
        path = ROOT / doc
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                bad.append(f"{doc}: link to {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors_of(dest):
                bad.append(f"{doc}: link to {target}: no heading '{anchor}' in {dest.relative_to(ROOT)}")
    return bad


def run(block: Block, scratch: Path, env: dict[str, str]) -> tuple[bool, str, float]:
    text = substitute(block.text, scratch)
    text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith(SELF + " "))
    written = []
    for name, body in block.files.items():
        target = ROOT / name
        if not target.exists():
            target.write_text(body)
            written.append(target)
    start = time.monotonic()
    # The output goes to a file, not a pipe: what a failed block left running in the
    # background (a feeder) would hold a pipe open, and the stage would wait for it.
    with tempfile.TemporaryFile(mode="w+", errors="replace") as log:
        proc = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", text],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=BLOCK_TIMEOUT_S)
            ok = proc.returncode == 0
            tail = "" if ok else f"\n[exit status {proc.returncode}]"
        except subprocess.TimeoutExpired:
            ok = False
            tail = f"\n[still running after {BLOCK_TIMEOUT_S} s: stopped, and counted as a failure]"
        finally:
            # What the block left running (a feeder in the background) ends with it.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            for target in written:
                target.unlink()
        log.seek(0)
        out = log.read() + tail
    return ok, out, time.monotonic() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="run the blocks whose source contains this")
    p.add_argument("--list", action="store_true", help="list the blocks and exit")
    p.add_argument("--links-only", action="store_true", help="check the links and README.md's size only")
    a = p.parse_args()

    problems = check_links()
    size = (ROOT / "README.md").stat().st_size
    if size > README_MAX_BYTES:
        problems.append(f"README.md is {size} bytes, more than {README_MAX_BYTES}: move detail into docs/")
    for line in problems:
        print(f"docs: FAIL: {line}")
    if a.links_only:
        return 1 if problems else 0
    blocks = [b for b in all_blocks() if not a.only or a.only in b.source]
    if a.list:
        for b in blocks:
            status = f"not run: {b.skip}" if b.skip else "run"
            print(f"{b.source}: {status}\n    " + b.text.strip().replace("\n", "\n    "))
        return 0

    scratch = Path(tempfile.mkdtemp(prefix="mf-docs-"))
    for d in ("data", "shared", "tmp"):
        (scratch / d).mkdir()
    env = dict(os.environ)
    # The test venv's bin first: `python`, and `meshfeed` where `pip install ./python`
    # put it; then the command line as `cargo build --release` leaves it.
    env["PATH"] = f"{ROOT}/.venv/bin:{ROOT}/target/release:{env['PATH']}"
    # What README.md's "Running under MPI" says to export as root on a small machine.
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
        OMPI_MCA_mpi_yield_when_idle="1",
        HDF5_USE_FILE_LOCKING="FALSE",
    )
    # Ignored entries the commands may create in the checkout, removed afterwards.
    created = [ROOT / name for name in ("venv",) if not (ROOT / name).exists()]
    failed, skipped = [], []
    for b in blocks:
        if b.skip:
            skipped.append(b)
            print(f"docs: not run: {b.source}: {b.skip}", flush=True)
            continue
        print(f"docs: running {b.source}", flush=True)
        ok, out, seconds = run(b, scratch, env)
        print(f"docs: {'ok' if ok else 'FAIL'}: {b.source} ({seconds:.0f} s)", flush=True)
        if not ok:
            failed.append(b)
            print("    " + substitute(b.text, scratch).strip().replace("\n", "\n    "))
            print("".join("    | " + line + "\n" for line in out.splitlines()[-40:]), flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    for made in created:  # what the commands made in the checkout (README's venv)
        shutil.rmtree(made, ignore_errors=True)
    ran = len(blocks) - len(skipped)
    print(
        f"docs: {ran - len(failed)} of {ran} blocks passed, {len(skipped)} not run (reasons above), "
        f"{len(problems)} link or size problems"
    )
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main())
