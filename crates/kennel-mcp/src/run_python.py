"""run_python_code's program, in a fresh sandbox: runs the code as pydantic's mcp-run-python
does and prints its answer as one JSON object, {"status": "success"|"run-error", "output":
[lines of stdout and stderr, interleaved as written], "return_value": the last expression's
value (None: absent; a str as it is; anything else as indented JSON), "error": the traceback}.

The request comes on stdin as JSON: {"code": str, "globals": {name: JSON value}}. The code is
main.py to its tracebacks, may use top-level await, and its last expression is its value.
"""

import ast
import asyncio
import inspect
import io
import json
import sys
import traceback


class Lines(io.TextIOBase):
    """stdout and stderr both: whole lines, in the order written."""

    def __init__(self):
        self.lines, self.rest = [], ""

    def writable(self):
        return True

    def write(self, text):
        *done, self.rest = (self.rest + text).split("\n")
        self.lines.extend(done)
        return len(text)

    def close_lines(self):
        if self.rest:
            self.lines.append(self.rest)
        return self.lines


def run(code, namespace, loop):
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(code, "main.py", "exec", ast.PyCF_ONLY_AST | flags)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    for part, mode in ((tree, "exec"), (last, "eval")):
        if part is None:
            continue
        value = eval(compile(part, "main.py", mode, flags), namespace)
        if inspect.iscoroutine(value):
            value = loop.run_until_complete(value)
    return value if last is not None else None


def encoded(value):
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, indent=2, default=repr)


def main():
    request = json.load(sys.stdin)
    sink = Lines()
    sys.stdout = sys.stderr = sink
    namespace = {"__name__": "__main__", **request.get("globals", {})}
    answer = {"status": "success"}
    loop = asyncio.new_event_loop()
    try:
        answer["return_value"] = encoded(run(request["code"], namespace, loop))
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are the code's errors too
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "main.py":
            tb = tb.tb_next
        text = "".join(traceback.format_exception(type(exc), exc, tb)).rstrip("\n")
        answer = {"status": "run-error", "error": text}
    answer["output"] = sink.close_lines()
    sys.__stdout__.write(json.dumps(answer))


main()
