#!/usr/bin/env python3
"""Compares linea-bleu with sacreBLEU's command line on random multilingual files.

    python3 apps/tools/check_linea_bleu.py build/release/apps/tools/linea-bleu \
        [--sacrebleu "python3 -m sacrebleu"] [--cases 500] [--seed 0] [-v]

Each case writes 1-3 reference files and a hypothesis (a mutation of the first reference) made of
words from several scripts, ASCII and Unicode punctuation, numbers with . , -, HTML entities,
<skipped>, Unicode whitespace of every kind Python knows (and some it does not, like U+200B),
'\\r', tabs, a BOM, empty and blank lines, a missing final newline; then runs both tools with the
same random flags (-m bleu/chrf/both, -w, -b, -f text, chrF options, stdin or -i) and requires the same exit
status and, on success, byte-identical stdout. Prints "N passed, M failed" and exits 1 on any
failure. Needs sacreBLEU 2.x (pip install sacrebleu; its version string differs from 2.3.1
unless that release is installed, so the version field is masked before comparing); a manual
check, not a ctest.
"""
import argparse
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile

WORDS = (
    "the dog bit man It was n't surprising had just bitten him first The U.S. e-mail "
    "¿Quién ¡Oh año niño señor está qué Straße Größe über naïve café "
    "Привет мир как дела Ελλάδα καλημέρα 中文 测试 我们 日本語 テスト ひらがな "
    "مرحبا بالعالم नमस्ते हिन्दी 😀 🚀 👍🏽 e\u0301 "
    "3.14 1,000 10-20 2019- -5 $5.00 5% #1 @user http://x.y/z a/b "
    ", . ... ! ? ; : 's ( ) [ ] { } \" ' “ ” « » — – - -- / \\ | ~ ^ _ ` * + = < > & "
    "&quot; &amp; &lt; &gt; &amp;lt; &apos; <skipped> <skip <skipped>ped> x-"
).split()
SEPARATORS = [" "] * 30 + ["  ", "\t", "\u00a0", "\u2009", "\u3000", "\u200b", "\x1c", "\x1f", "\x85",
                            "\u2028", "\u202f", "\x0b", "\x0c", "\r", "\u180e", "\ufeff", ""]


def sentence(rng, words=None):
    if words is None:
        words = [rng.choice(WORDS) for _ in range(rng.choice([0, 1, 2, 3, 5, 8, 13, 20]))]
    out = ""
    for i, w in enumerate(words):
        out += (rng.choice(SEPARATORS) if i else "") + w
    if rng.random() < 0.2:
        out = rng.choice(SEPARATORS) + out
    if rng.random() < 0.2:
        out += rng.choice([" ", "\t", "\u3000", "\r", "  "])
    return out, words


def mutate(rng, words):
    out = []
    for w in words:
        r = rng.random()
        if r < 0.1:
            continue
        if r < 0.2:
            out.append(rng.choice(WORDS))
        elif r < 0.25:
            out += [w, w]
        else:
            out.append(w)
    if len(out) > 1 and rng.random() < 0.3:
        i = rng.randrange(len(out) - 1)
        out[i], out[i + 1] = out[i + 1], out[i]
    return out


def write(path, lines, rng, final_newline):
    text = "\n".join(lines) + ("\n" if final_newline else "")
    if rng.random() < 0.05:
        text = "\ufeff" + text
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def run(cmd, stdin_path):
    with open(stdin_path, "rb") if stdin_path else open(os.devnull, "rb") as fin:
        p = subprocess.run(cmd, stdin=fin, capture_output=True)
    return p.returncode, p.stdout


def mask_version(out):
    return re.sub(rb"version:[0-9.]+|\"version\": \"[0-9.]+\"", b"VERSION", out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("linea_bleu")
    ap.add_argument("--sacrebleu", default=f"{sys.executable} -m sacrebleu")
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-v", action="store_true")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    passed = failed = both_failed = 0
    with tempfile.TemporaryDirectory() as d:
        for case in range(a.cases):
            n = rng.choice([1, 1, 2, 3, 7, 20, 60])
            nrefs = rng.choice([1, 1, 1, 2, 3])
            refs, words0 = [], []
            for r in range(nrefs):
                lines = []
                for i in range(n):
                    s, w = sentence(rng)
                    lines.append(s)
                    if r == 0:
                        words0.append(w)
                refs.append(lines)
            hyp = [sentence(rng, mutate(rng, w))[0] if rng.random() < 0.9 else sentence(rng)[0] for w in words0]
            if rng.random() < 0.03:  # a line-count mismatch: both must fail
                hyp = hyp[:-1] if len(hyp) > 1 else hyp + ["extra"]
            use_stdin = rng.random() < 0.3
            if use_stdin:  # tabs there would make sacreBLEU score several systems
                hyp = [h.replace("\t", " ") for h in hyp]
            paths = []
            for r, lines in enumerate(refs):
                paths.append(os.path.join(d, f"ref{r}.txt"))
                write(paths[-1], lines, rng, rng.random() < 0.9)
            hyp_path = os.path.join(d, "hyp.txt")
            write(hyp_path, hyp, rng, rng.random() < 0.9)

            flags = ["-m"] + rng.choice([["bleu"], ["chrf"], ["bleu", "chrf"], ["chrf", "bleu"]])
            if rng.random() < 0.3:
                flags += ["-w", str(rng.choice([0, 1, 2, 3, 4, 6, 10]))]
            if rng.random() < 0.2:
                flags.append("-b")
            if rng.random() < 0.15:
                flags += ["-f", "text"]
            if rng.random() < 0.2:
                flags += rng.choice([["--chrf-eps-smoothing"], ["--chrf-whitespace"], ["--chrf-beta", "3"],
                                     ["--chrf-char-order", "4"], ["--chrf-beta", "1", "--chrf-eps-smoothing"]])
            io_flags = [] if use_stdin else ["-i", hyp_path]
            args = paths + io_flags + flags
            lc, lo = run([a.linea_bleu] + args, hyp_path if use_stdin else None)
            sc, so = run(shlex.split(a.sacrebleu) + args, hyp_path if use_stdin else None)
            ok = (lc == 0) == (sc == 0) and (lc != 0 or mask_version(lo) == mask_version(so))
            passed += ok
            failed += not ok
            both_failed += ok and lc != 0
            if not ok or a.v:
                print(f"case {case}: {'ok' if ok else 'MISMATCH'}: {' '.join(args)}{' < hyp' if use_stdin else ''}")
                if not ok:
                    print(f"  linea-bleu (exit {lc}):\n{lo.decode()}\n  sacrebleu (exit {sc}):\n{so.decode()}")
                    keep = os.path.join(os.getcwd(), f"check_linea_bleu_case{case}")
                    os.makedirs(keep, exist_ok=True)
                    for p in paths + [hyp_path]:
                        with open(p, "rb") as f, open(os.path.join(keep, os.path.basename(p)), "wb") as g:
                            g.write(f.read())
                    print(f"  files kept in {keep}")
    print(f"({both_failed} of the passed cases are inputs both tools refuse)")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
