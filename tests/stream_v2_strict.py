"""A strict reader of Stream V2 messages, written from the field tables of DECTRIS'
specification (SIMPLON 1.8 "Stream V2": start, image and end messages), not from rdaq's
code: every field the tables list must be there with the type the data-model table gives
it, and no other top-level field may appear except `user_data` (the specification's
extension point; rdaq puts it on `end` too, which DECTRIS' reference parser skips like any
field it does not know) and `image_dtype` (read by DECTRIS' reference parser). Typed
arrays may be signed (int16/int32): rdaq's photon counts are signed, a documented
deviation (docs/stream.md)."""
import datetime
from collections.abc import Mapping

import cbor2

# cbor2 hands the insides of a tag (every message is inside tag 55799) over immutable:
# arrays as tuples, maps as frozendicts
ARRAY = (list, tuple)

# RFC 8746 typed-array tags, little-endian: uint8, uint16, uint32, float32, and the signed
# int16, int32 rdaq's photon counts use
TYPED_ARRAY_TAGS = {64, 69, 70, 85, 77, 78}


def is_integer(v):
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 64


def is_float(v):
    return isinstance(v, float)


def is_bool(v):
    return isinstance(v, bool)


def is_text(v):
    return isinstance(v, str)


def is_datetime(v):
    """DateTime: tag 0 around an RFC 3339 text string (cbor2 decodes tag 0 into a datetime
    itself, checking the text; a kept tag 0 is checked here)."""
    if isinstance(v, datetime.datetime):
        return v.tzinfo is not None
    if not (isinstance(v, cbor2.CBORTag) and v.tag == 0 and isinstance(v.value, str)):
        return False
    try:
        datetime.datetime.fromisoformat(v.value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def is_rational(v):
    return isinstance(v, ARRAY) and len(v) == 2 and all(is_integer(x) for x in v) and v[1] > 0


def is_bytes(v):
    """A byte string, or DECTRIS' compression tag 56500 around [algorithm, elem size, bytes]."""
    if isinstance(v, bytes):
        return True
    return (isinstance(v, cbor2.CBORTag) and v.tag == 56500 and isinstance(v.value, ARRAY) and len(v.value) == 3
            and is_text(v.value[0]) and is_integer(v.value[1]) and isinstance(v.value[2], bytes))


def is_typed_array(v):
    return isinstance(v, cbor2.CBORTag) and v.tag in TYPED_ARRAY_TAGS and is_bytes(v.value)


def is_multidim(v):
    if not (isinstance(v, cbor2.CBORTag) and v.tag == 40 and isinstance(v.value, ARRAY) and len(v.value) == 2):
        return False
    dims, arr = v.value
    return isinstance(dims, ARRAY) and all(is_integer(d) for d in dims) and is_typed_array(arr)


def map_of(value_ok):
    return lambda v: isinstance(v, Mapping) and all(is_text(k) and value_ok(x) for k, x in v.items())


def array_of(value_ok):
    return lambda v: isinstance(v, ARRAY) and all(value_ok(x) for x in v)


def is_goniometer(v):
    axis = map_of(is_float)
    return isinstance(v, Mapping) and all(is_text(k) and isinstance(a, Mapping) and set(a) == {"increment", "start"} and axis(a) for k, a in v.items())


START = {
    "type": is_text, "arm_date": is_datetime, "beam_center_x": is_float, "beam_center_y": is_float,
    "channels": array_of(is_text), "count_time": is_float, "countrate_correction_enabled": is_bool,
    "countrate_correction_lookup_table": is_typed_array, "detector_description": is_text,
    "detector_serial_number": is_text, "detector_translation": array_of(is_float),
    "flatfield": map_of(is_multidim), "flatfield_enabled": is_bool, "frame_time": is_float,
    "goniometer": is_goniometer, "image_size_x": is_integer, "image_size_y": is_integer,
    "incident_energy": is_float, "incident_wavelength": is_float, "number_of_images": is_integer,
    "pixel_mask": map_of(is_multidim), "pixel_mask_enabled": is_bool, "pixel_size_x": is_float,
    "pixel_size_y": is_float, "saturation_value": is_integer, "sensor_material": is_text,
    "sensor_thickness": is_float, "series_id": is_integer, "series_unique_id": is_text,
    "threshold_energy": map_of(is_float), "user_data": lambda v: True,
    "virtual_pixel_interpolation_enabled": is_bool,
}
IMAGE = {
    "type": is_text, "data": map_of(is_multidim), "image_id": is_integer, "real_time": is_rational,
    "series_date": is_datetime, "series_id": is_integer, "series_unique_id": is_text,
    "start_time": is_rational, "stop_time": is_rational, "user_data": lambda v: True,
}
END = {"type": is_text, "series_id": is_integer, "series_unique_id": is_text}
TABLES = {"start": START, "image": IMAGE, "end": END}
# beyond the tables: the extension point, and what DECTRIS' reference parser reads too
ALSO = {"start": {"image_dtype": is_text}, "image": {}, "end": {"user_data": lambda v: True}}


def problems(msg):
    """What is wrong with one decoded message (tags kept as CBORTag), as sentences."""
    kind = msg.get("type")
    if kind not in TABLES:
        return [f"type {kind!r} is not start, image or end"]
    table, also = TABLES[kind], ALSO[kind]
    out = [f"{kind}: no field {k}" for k in table if k not in msg]
    out += [f"{kind}: field {k} is not of its type: {msg[k]!r:.200}" for k in table if k in msg and not table[k](msg[k])]
    out += [f"{kind}: field {k} is not in the specification" for k in msg if k not in table and k not in also]
    out += [f"{kind}: field {k} is not of its type" for k in msg if k in also and not also[k](msg[k])]
    if kind == "start":
        out += [f"start: channels {msg.get('channels')} are not the keys of pixel_mask"
                for _ in [0] if "pixel_mask" in msg and msg["pixel_mask"] and sorted(msg["pixel_mask"]) != sorted(msg.get("channels", []))]
    if kind == "image" and "data" in msg and not msg["data"]:
        out.append("image: data has no channel")
    return out


def seconds(r):
    return r[0] / r[1]
