"""The standard library as a closed world: every module classed, data-only or code-running.

A global from the standard library is a name whose behaviour under full
unpickling is known: the standard library is finite. So it is not guessed
from a module list or from capitalisation: ``DATA_NAMES`` lists the few
globals a checkpoint may hold as data (constructing them with the file's
arguments runs nothing of consequence: no file, process, import, network
or evaluation), and every other global of every module in ``MODULES`` is
code-running (``wave.Wave_write(path)`` creates a file, ``sqlite3.connect``
opens one, ``mailbox.Maildir(path, create=True)`` makes folders).
``tests/unpickle/test_stdlib.py`` checks that ``MODULES`` covers
``sys.stdlib_module_names`` of the running interpreter; it also lists the
modules of the other supported versions (3.10 to 3.14), so a file names
the same verdict on every one of them.
"""

from __future__ import annotations

import builtins

__all__ = ["MODULES", "DATA_NAMES", "is_stdlib", "is_data"]

# every top-level module of CPython 3.10-3.14 (sys.stdlib_module_names, unioned)
MODULES = frozenset({
    '__future__', '__hello__', '__phello__', '_abc', '_aix_support', '_android_support',
    '_apple_support', '_ast', '_asyncio', '_bisect', '_blake2', '_bootsubprocess', '_bz2',
    '_codecs', '_codecs_cn', '_codecs_hk', '_codecs_iso2022', '_codecs_jp', '_codecs_kr',
    '_codecs_tw', '_collections', '_collections_abc', '_colorize', '_compat_pickle',
    '_compression', '_contextvars', '_crypt', '_csv', '_ctypes', '_curses', '_curses_panel',
    '_datetime', '_dbm', '_decimal', '_elementtree', '_frozen_importlib',
    '_frozen_importlib_external', '_functools', '_gdbm', '_hashlib', '_heapq', '_hmac', '_imp',
    '_interpchannels', '_interpqueues', '_interpreters', '_io', '_ios_support', '_json',
    '_locale', '_lsprof', '_lzma', '_markupbase', '_md5', '_msi', '_multibytecodec',
    '_multiprocessing', '_opcode', '_opcode_metadata', '_operator', '_osx_support', '_overlapped',
    '_pickle', '_posixshmem', '_posixsubprocess', '_py_abc', '_pydatetime', '_pydecimal', '_pyio',
    '_pylong', '_pyrepl', '_queue', '_random', '_remote_debugging', '_scproxy', '_sha1',
    '_sha256', '_sha3', '_sha512', '_signal', '_sitebuiltins', '_socket', '_sqlite3', '_sre',
    '_ssl', '_stat', '_statistics', '_string', '_strptime', '_struct', '_suggestions',
    '_symtable', '_sysconfig', '_testbuffer', '_testcapi', '_testclinic', '_testimportmultiple',
    '_testinternalcapi', '_testlimitedcapi', '_testmultiphase', '_testsinglephase', '_thread',
    '_threading_local', '_tkinter', '_tokenize', '_tomllib', '_tracemalloc', '_types', '_typing',
    '_uuid', '_warnings', '_weakref', '_weakrefset', '_winapi', '_wmi', '_xxtestfuzz',
    '_zoneinfo', '_zstd', 'abc', 'aifc', 'annotationlib', 'antigravity', 'argparse', 'array',
    'ast', 'asynchat', 'asyncio', 'asyncore', 'atexit', 'audioop', 'base64', 'bdb', 'binascii',
    'bisect', 'builtins', 'bz2', 'cProfile', 'calendar', 'cgi', 'cgitb', 'chunk', 'cmath', 'cmd',
    'code', 'codecs', 'codeop', 'collections', 'colorsys', 'compileall', 'compression',
    'concurrent', 'configparser', 'contextlib', 'contextvars', 'copy', 'copyreg', 'crypt', 'csv',
    'ctypes', 'curses', 'dataclasses', 'datetime', 'dbm', 'decimal', 'difflib', 'dis',
    'distutils', 'doctest', 'email', 'encodings', 'ensurepip', 'enum', 'errno', 'faulthandler',
    'fcntl', 'filecmp', 'fileinput', 'fnmatch', 'fractions', 'ftplib', 'functools', 'gc',
    'genericpath', 'getopt', 'getpass', 'gettext', 'glob', 'graphlib', 'grp', 'gzip', 'hashlib',
    'heapq', 'hmac', 'html', 'http', 'idlelib', 'imaplib', 'imghdr', 'imp', 'importlib',
    'inspect', 'io', 'ipaddress', 'itertools', 'json', 'keyword', 'lib2to3', 'linecache',
    'locale', 'logging', 'lzma', 'mailbox', 'mailcap', 'marshal', 'math', 'mimetypes', 'mmap',
    'modulefinder', 'msilib', 'msvcrt', 'multiprocessing', 'netrc', 'nis', 'nntplib', 'nt',
    'ntpath', 'nturl2path', 'numbers', 'opcode', 'operator', 'optparse', 'os', 'ossaudiodev',
    'pathlib', 'pdb', 'pickle', 'pickletools', 'pipes', 'pkgutil', 'platform', 'plistlib',
    'poplib', 'posix', 'posixpath', 'pprint', 'profile', 'pstats', 'pty', 'pwd', 'py_compile',
    'pyclbr', 'pydoc', 'pydoc_data', 'pyexpat', 'queue', 'quopri', 'random', 're', 'readline',
    'reprlib', 'resource', 'rlcompleter', 'runpy', 'sched', 'secrets', 'select', 'selectors',
    'shelve', 'shlex', 'shutil', 'signal', 'site', 'smtpd', 'smtplib', 'sndhdr', 'socket',
    'socketserver', 'spwd', 'sqlite3', 'sre_compile', 'sre_constants', 'sre_parse', 'ssl', 'stat',
    'statistics', 'string', 'stringprep', 'struct', 'subprocess', 'sunau',
    'symtable', 'sys', 'sysconfig', 'syslog', 'tabnanny', 'tarfile', 'telnetlib', 'tempfile',
    'termios', 'textwrap', 'this', 'threading', 'time', 'timeit', 'tkinter', 'token', 'tokenize',
    'tomllib', 'trace', 'traceback', 'tracemalloc', 'tty', 'turtle', 'turtledemo', 'types',
    'typing', 'unicodedata', 'unittest', 'urllib', 'uu', 'uuid', 'venv', 'warnings', 'wave',
    'weakref', 'webbrowser', 'winreg', 'winsound', 'wsgiref', 'xdrlib', 'xml', 'xmlrpc', 'zipapp',
    'zipfile', 'zipimport', 'zlib', 'zoneinfo',})

_EXCEPTIONS = frozenset(name for name, value in vars(builtins).items()
                        if isinstance(value, type) and issubclass(value, BaseException))

# module -> the globals of it that are data: recorded, never run; full unpickling of them
# runs no code of consequence either. Everything else in MODULES is code-running.
DATA_NAMES: dict[str, frozenset[str]] = {
    "builtins": _EXCEPTIONS | {"object", "Ellipsis", "NotImplemented"},
    "collections": frozenset({"OrderedDict", "Counter", "defaultdict", "deque", "ChainMap",
                              "UserDict", "UserList", "UserString"}),
    "argparse": frozenset({"Namespace"}),
    "datetime": frozenset({"datetime", "date", "time", "timedelta", "timezone"}),
    "decimal": frozenset({"Decimal"}),
    "fractions": frozenset({"Fraction"}),
    "uuid": frozenset({"UUID", "SafeUUID"}),
    "pathlib": frozenset({"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath",
                          "PureWindowsPath"}),
    "ipaddress": frozenset({"IPv4Address", "IPv6Address", "IPv4Network", "IPv6Network",
                            "IPv4Interface", "IPv6Interface"}),
    "types": frozenset({"SimpleNamespace"}),
    # special forms and aliases used as values (omegaconf's ref_type, typing.Any): none can
    # be called to build anything (the instantiable aliases, OrderedDict, DefaultDict, ... are
    # not here)
    "typing": frozenset({"Any", "List", "Dict", "Tuple", "Set", "FrozenSet", "Type",
                         "Optional", "Union", "Callable", "Sequence", "Mapping",
                         "MutableMapping", "MutableSequence", "Iterable", "Iterator",
                         "Literal", "ClassVar", "Final"}),
    "array": frozenset({"array", "_array_reconstructor"}),
}


def is_stdlib(resolved: str) -> bool:
    """Whether ``resolved`` (``module.name``) names a global of the standard library."""
    return resolved.split(".", 1)[0] in MODULES


def is_data(resolved: str) -> bool:
    """A standard-library global that is data (everything else there runs code)."""
    module, _, name = resolved.rpartition(".")
    return name in DATA_NAMES.get(module, ())
