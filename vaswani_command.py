"""The `vaswani` command's entry point (the installed script's). It sits outside the `vaswani_hf` package so that
it runs before the package's import, which registers the model with Transformers (0.8 s to import Transformers,
3 s with its model classes, on a 2-core AMD EPYC): `vaswani translate` first tries its light start
(`vaswani_hf/translation/light_translator.py`), which runs on torch alone, and the package finishes its import
where it hands over (`vaswani_hf.finish_import`). Every other command imports the package as a program would.

The light start is the script's alone: `main()` reading the process's own arguments. A program that calls
`main([...])` with its arguments, or `vaswani_hf.cli.main`, gets the package's whole import (its Auto classes
registered for what it does next), and still the light translation of the lines.
"""

import sys

light_start = False  # read by `vaswani_hf.light_start()`, while the script's command runs


def main(argv: list[str] | None = None) -> int:
    global light_start
    light_start = argv is None and sys.argv[1:2] == ["translate"] and "vaswani_hf" not in sys.modules
    argv = sys.argv[1:] if argv is None else argv
    try:
        from vaswani_hf.cli import main as vaswani

        return vaswani(argv)
    finally:
        light_start = False


if __name__ == "__main__":  # `python -m vaswani_command`: the package reads this module by its own name
    from vaswani_command import main as entry

    sys.exit(entry())
