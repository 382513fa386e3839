#!/usr/bin/env python3
"""TensorFlow's own schemas, read out of the installed wheel: the source of coord's TF protos.

TensorFlow ships some of its protos as Python modules (`tensorflow/core/framework/*_pb2.py`,
`tensorflow/core/protobuf/data_service_pb2.py`) and the rest only inside its shared libraries, as
the serialized `FileDescriptorProto` each generated C++ file embeds (the tf.data service's
`tensorflow/core/data/service/*.proto` among them). This script finds a file's descriptor either
way: in Python's descriptor pool after importing TensorFlow, or by finding the bytes
`0x0a <len> <file name>` in `libtensorflow_cc.so.2` (the descriptor's first field is its name)
and reading protobuf fields from there until they no longer parse as a `FileDescriptorProto`.

Subcommands:

  proto FILE...
      Prints each file's schema as .proto text (messages, enums, services, field numbers exact).

  check FDS
      FDS is a serialized `FileDescriptorSet` of coord's protos. Every message, enum and service
      of a `tensorflow` package in it is compared with TensorFlow's of the same full name: each
      field's number, type, label and type name; each enum value's number; each method's types.
      Prints one JSON object: {"checked": N, "mismatches": [...]} (coord may declare fewer
      fields or messages than TensorFlow; whatever it declares must be TensorFlow's).
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from google.protobuf import descriptor_pb2, descriptor_pool  # noqa: E402

LIBRARIES = ("libtensorflow_cc.so.2", "libtensorflow_framework.so.2")


def tf_dir():
    import importlib.util

    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("tensorflow is not installed in this Python")
    return list(spec.submodule_search_locations)[0]


def read_varint(buf, pos):
    shift = 0
    value = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("bad varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


# FileDescriptorProto's fields and their wire types (2 = length-delimited, 0 = varint).
FILE_FIELDS = {1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 6: 2, 7: 2, 8: 2, 9: 2, 10: 0, 11: 0, 12: 2, 14: 0}


def descriptor_at(buf, start):
    """The longest prefix of buf[start:] made of FileDescriptorProto fields, parsed."""
    pos = start
    end = start
    while pos < len(buf):
        try:
            key, p = read_varint(buf, pos)
            number, wire = key >> 3, key & 7
            if FILE_FIELDS.get(number) != wire:
                break
            if wire == 0:
                _, p = read_varint(buf, p)
            else:
                n, p = read_varint(buf, p)
                if p + n > len(buf):
                    break
                p += n
        except ValueError:
            break
        pos = end = p
    fd = descriptor_pb2.FileDescriptorProto()
    fd.ParseFromString(bytes(buf[start:end]))
    return fd


_LIBRARY_BYTES = {}


def from_libraries(name):
    needle = name.encode()
    marker = bytes([0x0A, len(needle)]) + needle
    for lib in LIBRARIES:
        path = os.path.join(tf_dir(), lib)
        if path not in _LIBRARY_BYTES:
            with open(path, "rb") as f:
                _LIBRARY_BYTES[path] = f.read()
        buf = _LIBRARY_BYTES[path]
        at = buf.find(marker)
        while at >= 0:
            fd = descriptor_at(buf, at)
            if fd.name == name and (fd.message_type or fd.service or fd.enum_type):
                return fd
            at = buf.find(marker, at + 1)
    return None


def file_descriptor(name):
    import tensorflow  # noqa: F401, PLC0415  (registers TF's Python protos in the pool)

    try:
        fd = descriptor_pool.Default().FindFileByName(name)
        out = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(out)
        return out
    except KeyError:
        pass
    fd = from_libraries(name)
    if fd is None:
        raise SystemExit(f"{name}: not in Python's descriptor pool nor in {LIBRARIES}")
    return fd


def load(name, pool=None):
    """Adds file `name` and what it imports to `pool` (Python's default pool if None), so that
    message classes can be made of its messages (`message_factory.GetMessageClass`)."""
    pool = pool or descriptor_pool.Default()
    try:
        return pool.FindFileByName(name)
    except KeyError:
        pass
    fd = file_descriptor(name)
    for dep in fd.dependency:
        load(dep, pool)
    try:
        return pool.FindFileByName(name)
    except KeyError:
        pool.Add(fd)
        return pool.FindFileByName(name)


# --- .proto text --------------------------------------------------------------------------------

F = descriptor_pb2.FieldDescriptorProto
SCALARS = {
    F.TYPE_DOUBLE: "double", F.TYPE_FLOAT: "float", F.TYPE_INT64: "int64",
    F.TYPE_UINT64: "uint64", F.TYPE_INT32: "int32", F.TYPE_FIXED64: "fixed64",
    F.TYPE_FIXED32: "fixed32", F.TYPE_BOOL: "bool", F.TYPE_STRING: "string",
    F.TYPE_BYTES: "bytes", F.TYPE_UINT32: "uint32", F.TYPE_SFIXED32: "sfixed32",
    F.TYPE_SFIXED64: "sfixed64", F.TYPE_SINT32: "sint32", F.TYPE_SINT64: "sint64",
}


def type_name(field):
    if field.type in SCALARS:
        return SCALARS[field.type]
    return field.type_name  # fully qualified, with the leading dot


def field_line(field, nested_maps, proto2):
    if field.type_name and field.type_name.split(".")[-1] in nested_maps:
        entry = nested_maps[field.type_name.split(".")[-1]]
        return f"map<{type_name(entry.field[0])}, {type_name(entry.field[1])}> {field.name} = {field.number};"
    label = ""
    if field.label == F.LABEL_REPEATED:
        label = "repeated "
    elif field.proto3_optional:
        label = "optional "
    elif proto2:
        label = "required " if field.label == F.LABEL_REQUIRED else "optional "
    extra = ""
    if field.options.HasField("packed"):
        extra = f" [packed = {'true' if field.options.packed else 'false'}]"
    if field.options.deprecated:
        extra = " [deprecated = true]"
    return f"{label}{type_name(field)} {field.name} = {field.number}{extra};"


def print_enum(enum, indent, out):
    pad = "  " * indent
    out.append(f"{pad}enum {enum.name} {{")
    for v in enum.value:
        out.append(f"{pad}  {v.name} = {v.number};")
    for r in enum.reserved_range:
        out.append(f"{pad}  reserved {r.start} to {r.end};")
    out.append(f"{pad}}}")


def print_message(msg, indent, out, proto2):
    pad = "  " * indent
    out.append(f"{pad}message {msg.name} {{")
    maps = {n.name: n for n in msg.nested_type if n.options.map_entry}
    for e in msg.enum_type:
        print_enum(e, indent + 1, out)
    for n in msg.nested_type:
        if not n.options.map_entry:
            print_message(n, indent + 1, out, proto2)
    real_oneofs = {}
    for f in msg.field:
        if f.HasField("oneof_index") and not f.proto3_optional:
            real_oneofs.setdefault(f.oneof_index, []).append(f)
    printed = set()
    for f in msg.field:
        if f.HasField("oneof_index") and not f.proto3_optional:
            if f.oneof_index in printed:
                continue
            printed.add(f.oneof_index)
            out.append(f"{pad}  oneof {msg.oneof_decl[f.oneof_index].name} {{")
            for g in real_oneofs[f.oneof_index]:
                out.append(f"{pad}    {field_line(g, maps, proto2)}")
            out.append(f"{pad}  }}")
        else:
            out.append(f"{pad}  {field_line(f, maps, proto2)}")
    for r in msg.reserved_range:
        out.append(f"{pad}  reserved {r.start} to {r.end - 1};")
    for name in msg.reserved_name:
        out.append(f'{pad}  reserved "{name}";')
    out.append(f"{pad}}}")


def proto_text(fd):
    out = [f"// {fd.name}, as the tensorflow-cpu wheel's descriptors have it.",
           f'syntax = "{fd.syntax or "proto2"}";', "", f"package {fd.package};", ""]
    for dep in fd.dependency:
        out.append(f'import "{dep}";')
    out.append("")
    for e in fd.enum_type:
        print_enum(e, 0, out)
        out.append("")
    for m in fd.message_type:
        print_message(m, 0, out, fd.syntax in ("", "proto2"))
        out.append("")
    for s in fd.service:
        out.append(f"service {s.name} {{")
        for m in s.method:
            out.append(f"  rpc {m.name}({m.input_type}) returns ({m.output_type});")
        out.append("}")
    return "\n".join(out) + "\n"


# --- comparison ---------------------------------------------------------------------------------


def index_file(fd, messages, enums, services):
    prefix = "." + fd.package if fd.package else ""

    def walk(msg, scope):
        full = f"{scope}.{msg.name}"
        messages[full] = msg
        for e in msg.enum_type:
            enums[f"{full}.{e.name}"] = e
        for n in msg.nested_type:
            walk(n, full)

    for m in fd.message_type:
        walk(m, prefix)
    for e in fd.enum_type:
        enums[f"{prefix}.{e.name}"] = e
    for s in fd.service:
        services[f"{prefix}.{s.name}"] = s


def check(fds_path):
    ours = descriptor_pb2.FileDescriptorSet()
    with open(fds_path, "rb") as f:
        ours.ParseFromString(f.read())
    our_m, our_e, our_s = {}, {}, {}
    for fd in ours.file:
        if fd.package == "tensorflow" or fd.package.startswith("tensorflow."):
            index_file(fd, our_m, our_e, our_s)
    tf_m, tf_e, tf_s = {}, {}, {}
    for fd in ours.file:
        if fd.package == "tensorflow" or fd.package.startswith("tensorflow."):
            index_file(file_descriptor(tf_name(fd)), tf_m, tf_e, tf_s)
    mismatches = []
    checked = 0
    for name, msg in sorted(our_m.items()):
        theirs = tf_m.get(name)
        if theirs is None:
            mismatches.append(f"message {name}: not in TensorFlow's schema")
            continue
        by_name = {f.name: f for f in theirs.field}
        for f in msg.field:
            checked += 1
            t = by_name.get(f.name)
            if t is None:
                mismatches.append(f"{name}.{f.name}: no such field in TensorFlow's schema")
                continue
            for attr in ("number", "type", "label", "type_name"):
                if getattr(f, attr) != getattr(t, attr):
                    mismatches.append(
                        f"{name}.{f.name}: {attr} {getattr(f, attr)!r}, TensorFlow's {getattr(t, attr)!r}")
            if f.HasField("oneof_index") != t.HasField("oneof_index") or f.proto3_optional != t.proto3_optional:
                mismatches.append(f"{name}.{f.name}: presence differs from TensorFlow's")
    for name, enum in sorted(our_e.items()):
        theirs = tf_e.get(name)
        if theirs is None:
            mismatches.append(f"enum {name}: not in TensorFlow's schema")
            continue
        by_name = {v.name: v.number for v in theirs.value}
        for v in enum.value:
            checked += 1
            if by_name.get(v.name) != v.number:
                mismatches.append(f"{name}.{v.name} = {v.number}, TensorFlow's {by_name.get(v.name)}")
    for name, svc in sorted(our_s.items()):
        theirs = tf_s.get(name)
        if theirs is None:
            mismatches.append(f"service {name}: not in TensorFlow's schema")
            continue
        by_name = {m.name: m for m in theirs.method}
        for m in svc.method:
            checked += 1
            t = by_name.get(m.name)
            if t is None or (t.input_type, t.output_type) != (m.input_type, m.output_type):
                mismatches.append(f"{name}.{m.name}: not TensorFlow's method")
    print(json.dumps({"checked": checked, "mismatches": mismatches}))


# coord keeps TF's package and file names, but a few of its files sit at other paths than TF's.
RENAMED = {
    "tensorflow/coordination_service.proto": "xla/tsl/protobuf/coordination_service.proto",
    "tensorflow/distributed_runtime_payloads.proto":
        "xla/tsl/protobuf/distributed_runtime_payloads.proto",
}


def tf_name(fd):
    return RENAMED.get(fd.name, fd.name)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "proto":
        for name in sys.argv[2:]:
            sys.stdout.write(proto_text(file_descriptor(name)))
    elif len(sys.argv) == 3 and sys.argv[1] == "check":
        check(sys.argv[2])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
