"""Rich results of a session's python execs, inside the kernel (see agent.py's docstring).

The agent carries this source as a string and the kernel compiles it on its first session
exec, so a pooled one-shot run, and a warm sandbox waiting for one, never load it. IPython is
never imported: its display protocol is small enough to speak here.

Per exec the kernel calls ``begin`` with the exec's options and its socket to the agent, runs the code with ``run`` (the last expression statement is evaluated
and shown, as Jupyter does), then calls ``end``, which shows the figures still open and
returns what the agent adds to the exec's result.

An output is ``{"kind": "value"|"display", "data": {MIME: content}}``: text types are
strings, ``image/png`` and ``image/jpeg`` base64 strings, ``application/json`` any JSON
value. The exec's outputs together stay within its output limit (what the JSON lines take)
and its ``MAX_OUTPUTS``; what does not fit is dropped and ``results_truncated`` says so.
"""

import ast
import base64
import builtins
import json
import os
import signal
import sys
import threading
import traceback

MAX_OUTPUTS = 64
# The display protocol's methods (IPython's formatters), in the order a bundle is filled.
REPR_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("text/latex", "_repr_latex_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("application/json", "_repr_json_"),
)
BINARY = ("image/png", "image/jpeg")
FIGURE_MIME = {"png": "image/png", "svg": "image/svg+xml"}


class Exec:
    """One exec's sink for outputs: its budget, and whether it is still open."""

    def __init__(self, sock, limit, figures):
        self.sock = sock
        self.budget = limit
        self.figures = figures
        self.count = 0
        self.truncated = False
        self.open = True
        self.lock = threading.Lock()
        self.pid = os.getpid()

    def emit(self, kind, data):
        # A lone surrogate (which JSON readers refuse) becomes "?".
        text = json.dumps({"kind": kind, "data": data}, ensure_ascii=False)
        line = b"display " + text.encode("utf-8", "replace") + b"\n"
        with self.lock:
            if not self.open or os.getpid() != self.pid:  # after the exec; in a fork of it
                return
            if self.count >= MAX_OUTPUTS or len(line) > self.budget:
                self.truncated = True
                return
            self.count += 1
            self.budget -= len(line)
            flush_output()  # what the code printed before this output goes out before it
            send_acked(self.sock, line)


CURRENT = None  # the exec running now, if any


def flush_output():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def send_acked(sock, line):
    """Sends a line and waits for the agent's one-byte answer, which comes once the agent has
    passed on the output written before it: so the code's prints and its rich outputs reach
    the caller in the order it made them. SIGINT is held back meanwhile: an interrupt must not
    cut a line in two or leave an answer unread."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        sock.sendall(line)
        sock.recv(1)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def setup():
    """Once per kernel: ``display`` as a builtin (as IPython has it), a non-interactive
    matplotlib backend unless the environment names one, and ``pyplot.show`` that shows."""
    builtins.display = display
    os.environ.setdefault("MPLBACKEND", "agg")
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.show = show
    else:
        sys.meta_path.insert(0, PyplotHook())


def begin(sock, options):
    global CURRENT
    figures = [f for f in options.get("figures", ["png"]) if f in FIGURE_MIME]
    CURRENT = Exec(sock, int(options["limit"]), figures)


def run(code, namespace, filename):
    """Runs a cell: its statements, then its last expression statement evaluated and shown
    as the exec's value (unless it is None or the statement ends with ``;``)."""
    tree = compile(code, filename, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not silenced(code, tree.body[-1]):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec", dont_inherit=True), namespace)
    if last is not None:
        value = eval(compile(last, filename, "eval", dont_inherit=True), namespace)
        if value is not None:
            show_object(value, "value")


def silenced(code, node):
    """Whether the statement is followed by ``;`` (Jupyter's way to hide a value)."""
    lines = code.splitlines()
    if node.end_lineno is None or node.end_lineno > len(lines):
        return False
    rest = lines[node.end_lineno - 1].encode("utf-8", "surrogatepass")[node.end_col_offset :]
    return rest.decode("utf-8", "replace").lstrip().startswith(";")


def end(error, trimmed_traceback):
    """Shows the figures still open, closes the exec, and returns its additions to the
    result: the error as data (not for SystemExit) and whether outputs were dropped."""
    global CURRENT
    current = CURRENT
    try:
        flush_figures()
    except Exception as exc:
        warn(f"kennel: cannot show the open figures: {exc!r}")
    with current.lock:
        current.open = False
    CURRENT = None
    data = None
    if error is not None and not isinstance(error, SystemExit):
        data = error_data(error, trimmed_traceback, current.budget)
    return {"error": data, "results_truncated": current.truncated}


def error_data(error, tb, limit):
    """``{"name", "value", "traceback"}``, the traceback's lines as python3 prints them,
    its first lines dropped when it would not fit in the limit."""
    try:
        text = "".join(traceback.format_exception(type(error), error, tb))
    except Exception:
        text = f"{type(error).__name__}: (traceback unavailable)\n"
    lines = clean(text).splitlines()
    while len(lines) > 2 and sum(len(line) + 1 for line in lines) > limit:
        del lines[1]
    try:
        value = clean(str(error))
    except Exception:
        value = "(unprintable)"
    return {"name": type(error).__name__, "value": value[:limit], "traceback": lines}


def clean(text):
    """The text without lone surrogates, which JSON readers refuse."""
    return text.encode("utf-8", "replace").decode("utf-8")


def warn(message):
    try:
        print(message, file=sys.stderr)
    except Exception:
        pass


# --- The display protocol -----------------------------------------------------------------


def display(*objs, **_options):
    """IPython's ``display``: shows each object as a rich output, in order."""
    for obj in objs:
        show_object(obj, "display")


def show_object(obj, kind):
    current = CURRENT
    if current is None:  # called outside an exec (from a thread left running, say)
        return
    data = bundle(obj, current.figures)
    if data:
        current.emit(kind, data)


def bundle(obj, figures):
    """The object's MIME bundle: ``_repr_mimebundle_``, then each ``_repr_*_``, then a
    matplotlib figure's images, and ``text/plain`` (its repr) always."""
    data = {}
    if not isinstance(obj, type):  # a class's _repr_*_ are unbound functions
        mimebundle = call_repr(obj, "_repr_mimebundle_", include=None, exclude=None)
        if isinstance(mimebundle, dict):
            data.update(mimebundle)
        for mime, method in REPR_METHODS:
            if mime not in data:
                value = call_repr(obj, method)
                if value is not None:
                    data[mime] = value
        if is_figure(obj):
            data.update(figure_images(obj, figures))
    if "text/plain" not in data:
        try:
            data["text/plain"] = repr(obj)
        except Exception as exc:
            data["text/plain"] = f"<unrepresentable {type(obj).__name__}: {exc!r}>"
    return normalise(data)


def call_repr(obj, name, **kwargs):
    """What ``obj.<name>(...)`` gives (a (data, metadata) pair's data); None when it has no
    such method or it fails (which is said on stderr, as IPython says it)."""
    try:
        method = getattr(obj, name, None)
    except Exception:
        return None
    if not callable(method):
        return None
    try:
        value = method(**kwargs)
    except Exception as exc:
        warn(f"kennel: {type(obj).__name__}.{name} failed: {exc!r}")
        return None
    if isinstance(value, tuple) and len(value) == 2:
        value = value[0]
    return value


def normalise(data):
    """Keeps what JSON can carry: base64 for binary images, text for text types, and JSON
    values that serialise; anything else is dropped."""
    out = {}
    for mime, value in data.items():
        if not isinstance(mime, str):
            continue
        if mime in BINARY and isinstance(value, (bytes, bytearray)):
            out[mime] = base64.b64encode(bytes(value)).decode("ascii")
        elif mime in BINARY and isinstance(value, str):
            out[mime] = value.strip()
        elif mime == "application/json" or mime.endswith("+json"):
            try:
                json.dumps(value)
                out[mime] = value
            except (TypeError, ValueError):
                pass
        elif isinstance(value, (bytes, bytearray)):
            out[mime] = bytes(value).decode("utf-8", "replace")
        elif isinstance(value, str):
            out[mime] = value
    return out


# --- matplotlib -----------------------------------------------------------------------------


def is_figure(obj):
    figure = sys.modules.get("matplotlib.figure")
    return figure is not None and isinstance(obj, figure.Figure)


def figure_images(fig, figures):
    import io

    images = {}
    for name in figures:
        buffer = io.BytesIO()
        try:
            fig.savefig(buffer, format=name, bbox_inches="tight")
        except Exception as exc:
            warn(f"kennel: cannot render a figure as {name}: {exc!r}")
            continue
        raw = buffer.getvalue()
        images[FIGURE_MIME[name]] = raw if name == "png" else raw.decode("utf-8", "replace")
    return images


def show(*_args, **_kwargs):
    """``matplotlib.pyplot.show`` in a session: each open figure becomes an output, then it
    is closed, as Jupyter's inline backend does."""
    flush_figures()


def flush_figures():
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None or CURRENT is None:
        return
    for number in pyplot.get_fignums():
        show_object(pyplot.figure(number), "display")
    pyplot.close("all")


class PyplotHook:
    """An import hook that sets ``pyplot.show`` as ``matplotlib.pyplot`` is first imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            module.show = show

        loader.exec_module = exec_module
        return spec


# The kernel leaves these frames out of the code's tracebacks.
KERNEL_CODES = (run.__code__,)
