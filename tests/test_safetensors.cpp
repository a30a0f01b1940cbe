// Tests of the safetensors reader, the model-folder loader and the writer. Malformed files are built by hand from raw
// bytes (not with write_safetensors), so that the reader is tested independently of the writer.
#include "model/io/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "kernels/common/error.h"
#include "tests/test_util.h"

namespace quest {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// [u64 little-endian header length][header][data]; `header_len` overrides the length field when given.
std::string raw_safetensors(const std::string& header, const std::string& data = "",
                            std::optional<uint64_t> header_len = std::nullopt) {
    const uint64_t n = header_len.value_or(header.size());
    std::string out;
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    return out + header + data;
}

void write_file(const fs::path& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    ASSERT_TRUE(out.good()) << path;
}

std::string read_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// The message of the InputError that opening `path` throws ("" when none is thrown).
std::string open_error(const fs::path& path) {
    try {
        SafeTensorsFile::open(path);
    } catch (const InputError& e) {
        return e.what();
    }
    ADD_FAILURE() << "no InputError opening " << path;
    return "";
}

std::string folder_error(const fs::path& dir) {
    try {
        ModelFiles files(dir);
    } catch (const InputError& e) {
        return e.what();
    }
    ADD_FAILURE() << "no InputError loading " << dir;
    return "";
}

// Writes a one-file model with header `header` and `data` bytes and returns the InputError opening it gives.
std::string malformed(const std::string& test, const std::string& header, const std::string& data = "") {
    const auto path = test::temp_dir(test) / "bad.safetensors";
    write_file(path, raw_safetensors(header, data));
    return open_error(path);
}

template <typename T>
std::span<const std::byte> as_bytes_of(const std::vector<T>& v) {
    return std::as_bytes(std::span<const T>(v));
}

template <typename T>
std::vector<T> read_values(const SafeTensorsFile& f, const TensorInfo& t) {
    std::vector<T> out(t.nbytes() / sizeof(T));
    std::memcpy(out.data(), f.data(t), t.nbytes());  // tensor data need not be aligned
    return out;
}

// ---------------------------------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------------------------------

TEST(SafeTensors, ShapeToString) {
    EXPECT_EQ(shape_to_string(std::vector<int64_t>{}), "[]");
    EXPECT_EQ(shape_to_string(std::vector<int64_t>{4096, 11008}), "[4096, 11008]");
}

TEST(SafeTensors, Numel) {
    TensorInfo t;
    EXPECT_EQ(t.numel(), 1);  // scalar
    t.shape = {2, 3, 4};
    EXPECT_EQ(t.numel(), 24);
    t.shape = {int64_t(1) << 62, int64_t(1) << 62, 0};  // prefix products overflow, but the tensor is empty
    EXPECT_EQ(t.numel(), 0);
    t.shape = {int64_t(1) << 62, int64_t(1) << 62};
    EXPECT_THROW(t.numel(), std::overflow_error);
}

// ---------------------------------------------------------------------------------------------------------------------
// Writer + reader round trip
// ---------------------------------------------------------------------------------------------------------------------

TEST(SafeTensors, RoundTrip) {
    const auto dir = test::temp_dir("st_roundtrip");
    const auto path = dir / "model.safetensors";
    const std::vector<float> f32 = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 65504.0f};
    const std::vector<uint16_t> f16 = {float_to_half(1.0f), float_to_half(-0.5f), float_to_half(2.0f)};
    const std::vector<uint16_t> bf16 = {float_to_bf16(3.0f), float_to_bf16(-1.0f), float_to_bf16(0.25f),
                                        float_to_bf16(8.0f)};
    const std::vector<int32_t> i32 = {7, -8, 2147483647};
    const std::vector<float> scalar = {42.0f};
    const std::vector<float> empty;
    const std::vector<TensorToWrite> tensors = {
        {"w.f32", DType::F32, {2, 3}, as_bytes_of(f32)},
        {"w.f16", DType::F16, {3}, as_bytes_of(f16)},  // 6 bytes: the next tensor starts unaligned
        {"w.bf16", DType::BF16, {2, 2}, as_bytes_of(bf16)},
        {"w.i32", DType::I32, {3}, as_bytes_of(i32)},
        {"w.scalar", DType::F32, {}, as_bytes_of(scalar)},
        {"w.empty", DType::F32, {0, 5}, as_bytes_of(empty)},
    };
    write_safetensors(path, tensors);
    EXPECT_FALSE(fs::exists(path.string() + ".tmp"));

    // Layout: header length a multiple of 8, data contiguous in the given order.
    const std::string raw = read_file(path);
    ASSERT_GE(raw.size(), 8u);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(raw[size_t(i)]);
    EXPECT_EQ(header_len % 8, 0u);
    EXPECT_EQ(raw.size(), 8 + header_len + 24 + 6 + 8 + 12 + 4 + 0);

    const auto f = SafeTensorsFile::open(path);
    EXPECT_EQ(f->path(), path);
    EXPECT_TRUE(f->metadata().empty());
    ASSERT_EQ(f->tensors().size(), tensors.size());
    uint64_t offset = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
        const TensorInfo& t = f->tensors()[i];
        SCOPED_TRACE(t.name);
        EXPECT_EQ(t.name, tensors[i].name);  // file order is kept
        EXPECT_EQ(t.dtype, tensors[i].dtype);
        EXPECT_EQ(t.shape, tensors[i].shape);
        EXPECT_EQ(t.begin, offset);
        EXPECT_EQ(t.nbytes(), tensors[i].bytes.size());
        offset = t.end;
        EXPECT_EQ(f->find(t.name), &t);
    }
    EXPECT_EQ(f->find("nope"), nullptr);
    EXPECT_EQ(read_values<float>(*f, *f->find("w.f32")), f32);
    EXPECT_EQ(read_values<uint16_t>(*f, *f->find("w.f16")), f16);
    EXPECT_EQ(read_values<uint16_t>(*f, *f->find("w.bf16")), bf16);
    EXPECT_EQ(read_values<int32_t>(*f, *f->find("w.i32")), i32);
    EXPECT_EQ(read_values<float>(*f, *f->find("w.scalar")), scalar);
    EXPECT_EQ(f->find("w.scalar")->numel(), 1);
    EXPECT_EQ(f->find("w.empty")->numel(), 0);
    EXPECT_EQ(f->find("w.empty")->nbytes(), 0u);

    std::vector<float> conv(3);
    convert_to_f32(DType::F16, f->data(*f->find("w.f16")), conv.data(), 3);
    EXPECT_EQ(conv, (std::vector<float>{1.0f, -0.5f, 2.0f}));
    conv.resize(4);
    convert_to_f32(DType::BF16, f->data(*f->find("w.bf16")), conv.data(), 4);
    EXPECT_EQ(conv, (std::vector<float>{3.0f, -1.0f, 0.25f, 8.0f}));

    // The same file through a model folder.
    const ModelFiles files(dir);
    EXPECT_EQ(files.files().size(), 1u);
    EXPECT_EQ(files.names().size(), tensors.size());
    const TensorRef ref = files.get("w.f32", std::vector<int64_t>{2, 3});
    std::vector<float> got(6);
    std::memcpy(got.data(), ref.data(), 24);
    EXPECT_EQ(got, f32);
    EXPECT_TRUE(files.find("w.i32").has_value());
    EXPECT_FALSE(files.find("w.nope").has_value());
}

TEST(SafeTensors, MetadataRoundTrip) {
    const auto path = test::temp_dir("st_meta") / "m.safetensors";
    const std::vector<float> v = {1.0f};
    const std::vector<TensorToWrite> tensors = {{"a", DType::F32, {1}, as_bytes_of(v)}};
    const std::map<std::string, std::string> meta = {{"format", "pt"}, {"quest.note", "h\u00e9llo \"quoted\""}};
    write_safetensors(path, tensors, meta);
    const auto f = SafeTensorsFile::open(path);
    EXPECT_EQ(f->metadata(), meta);
    ASSERT_EQ(f->tensors().size(), 1u);
}

TEST(SafeTensors, NoTensors) {
    const auto path = test::temp_dir("st_none") / "m.safetensors";
    write_safetensors(path, {});
    const auto f = SafeTensorsFile::open(path);
    EXPECT_TRUE(f->tensors().empty());
}

TEST(SafeTensors, WriterRejectsWrongByteCount) {
    const auto path = test::temp_dir("st_write_bad") / "m.safetensors";
    const std::vector<float> v = {1.0f, 2.0f, 3.0f};
    const std::vector<TensorToWrite> tensors = {{"a", DType::F32, {2, 2}, as_bytes_of(v)}};
    try {
        write_safetensors(path, tensors);
        ADD_FAILURE() << "no exception";
    } catch (const std::invalid_argument& e) {
        EXPECT_THAT(e.what(), HasSubstr("needs 16 bytes, got 12"));
        EXPECT_THAT(e.what(), HasSubstr("'a'"));
    }
    EXPECT_FALSE(fs::exists(path));
    EXPECT_FALSE(fs::exists(path.string() + ".tmp"));

    const std::vector<TensorToWrite> dup = {{"a", DType::F32, {3}, as_bytes_of(v)},
                                            {"a", DType::F32, {3}, as_bytes_of(v)}};
    EXPECT_THROW(write_safetensors(path, dup), std::invalid_argument);
    EXPECT_FALSE(fs::exists(path));
}

TEST(SafeTensors, WriterReplacesExistingFile) {
    const auto path = test::temp_dir("st_replace") / "m.safetensors";
    write_file(path, "old contents");
    const std::vector<float> v = {1.0f};
    write_safetensors(path, std::vector<TensorToWrite>{{"a", DType::F32, {1}, as_bytes_of(v)}});
    EXPECT_EQ(SafeTensorsFile::open(path)->tensors().size(), 1u);
}

TEST(SafeTensors, ZeroSizeTensorInsideAnotherIsNotAnOverlap) {
    const auto path = test::temp_dir("st_empty_inside") / "m.safetensors";
    write_file(path, raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                     R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                                     std::string(8, '\0')));
    EXPECT_EQ(SafeTensorsFile::open(path)->tensors().size(), 2u);
}

TEST(SafeTensors, HeaderWithoutPaddingAndUnalignedData) {
    // Readers must accept any header length (the 8-byte padding is only what writers should do).
    const auto path = test::temp_dir("st_unaligned") / "m.safetensors";
    const float x = 1.5f;
    std::string data(4, '\0');
    std::memcpy(data.data(), &x, 4);
    write_file(path, raw_safetensors(R"({"x":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})", data));
    const auto f = SafeTensorsFile::open(path);
    float got = 0;
    std::memcpy(&got, f->data(f->tensors().at(0)), 4);
    EXPECT_EQ(got, 1.5f);
}

// ---------------------------------------------------------------------------------------------------------------------
// Malformed files: each gives a specific InputError naming the file (and the tensor where there is one)
// ---------------------------------------------------------------------------------------------------------------------

TEST(SafeTensorsMalformed, TruncatedData) {
    const auto dir = test::temp_dir("st_truncated");
    const auto path = dir / "model.safetensors";
    const std::vector<float> a(4, 1.0f), b(8, 2.0f);
    write_safetensors(path, std::vector<TensorToWrite>{{"a", DType::F32, {4}, as_bytes_of(a)},
                                                       {"b", DType::F32, {2, 4}, as_bytes_of(b)}});
    fs::resize_file(path, fs::file_size(path) - 5);  // cut into the last tensor
    const std::string msg = open_error(path);
    EXPECT_THAT(msg, HasSubstr(path.string()));
    EXPECT_THAT(msg, HasSubstr("tensor 'b'"));
    EXPECT_THAT(msg, HasSubstr("data_offsets [16, 48] end lies beyond the data area of 43 bytes"));
    // Through a folder the message is the same.
    EXPECT_THAT(folder_error(dir), HasSubstr("end lies beyond the data area"));
}

TEST(SafeTensorsMalformed, HeaderLengthPastEof) {
    const auto path = test::temp_dir("st_hdr_eof") / "bad.safetensors";
    write_file(path, raw_safetensors("{}", "", 1000));
    const std::string msg = open_error(path);
    EXPECT_THAT(msg, HasSubstr(path.string()));
    EXPECT_THAT(msg, HasSubstr("header length 1000 extends past the end of the file (10 bytes)"));

    write_file(path, raw_safetensors("{}", "", ~uint64_t(0)));  // 8 + length would wrap around
    EXPECT_THAT(open_error(path), HasSubstr("extends past the end of the file"));
}

TEST(SafeTensorsMalformed, TinyAndEmptyFiles) {
    const auto dir = test::temp_dir("st_tiny");
    write_file(dir / "three.safetensors", "abc");
    std::string msg = open_error(dir / "three.safetensors");
    EXPECT_THAT(msg, HasSubstr("three.safetensors"));
    EXPECT_THAT(msg, HasSubstr("file is 3 bytes, too short to hold the 8-byte header length"));

    write_file(dir / "empty.safetensors", "");
    msg = open_error(dir / "empty.safetensors");
    EXPECT_THAT(msg, HasSubstr("empty.safetensors"));
    EXPECT_THAT(msg, HasSubstr("file is empty"));
}

TEST(SafeTensorsMalformed, MissingFileAndDirectory) {
    const auto dir = test::temp_dir("st_missing");
    std::string msg = open_error(dir / "nope.safetensors");
    EXPECT_THAT(msg, HasSubstr("nope.safetensors: cannot open"));
    msg = open_error(dir);
    EXPECT_THAT(msg, HasSubstr("not a regular file"));
}

TEST(SafeTensorsMalformed, HeaderInvalidJson) {
    std::string msg = malformed("st_badjson", R"({"a": {"dtype": "F32", )");
    EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
    EXPECT_THAT(msg, HasSubstr("header is not valid JSON"));
    msg = malformed("st_badjson0", "");  // zero-length header
    EXPECT_THAT(msg, HasSubstr("header is not valid JSON"));
}

TEST(SafeTensorsMalformed, HeaderNotAnObject) {
    const std::string msg = malformed("st_notobj", "[1, 2]");
    EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
    EXPECT_THAT(msg, HasSubstr("header is not a JSON object"));
}

TEST(SafeTensorsMalformed, DuplicateTensorName) {
    const std::string msg = malformed("st_dupkey", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                                   R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                      std::string(8, '\0'));
    EXPECT_THAT(msg, HasSubstr("bad.safetensors"));
    EXPECT_THAT(msg, HasSubstr("has the key 'a' twice"));
}

TEST(SafeTensorsMalformed, EntryNotAnObject) {
    const std::string msg = malformed("st_entry", R"({"a": [1, 2, 3]})");
    EXPECT_THAT(msg, HasSubstr("bad.safetensors: tensor 'a': entry is not a JSON object"));
}

TEST(SafeTensorsMalformed, MissingOrWronglyTypedFields) {
    EXPECT_THAT(malformed("st_f1", R"({"a":{"shape":[1],"data_offsets":[0,4]}})", "xxxx"),
                HasSubstr("bad.safetensors: tensor 'a': missing field 'dtype'"));
    EXPECT_THAT(malformed("st_f2", R"({"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", "xxxx"),
                HasSubstr("bad.safetensors: tensor 'a': field 'dtype' is not a string"));
    EXPECT_THAT(malformed("st_f3", R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", "xxxx"),
                HasSubstr("bad.safetensors: tensor 'a': missing field 'shape'"));
    EXPECT_THAT(malformed("st_f4", R"({"a":{"dtype":"F32","shape":4,"data_offsets":[0,4]}})", "xxxx"),
                HasSubstr("bad.safetensors: tensor 'a': field 'shape' is not an array"));
    EXPECT_THAT(malformed("st_f5", R"({"a":{"dtype":"F32","shape":[1]}})", "xxxx"),
                HasSubstr("bad.safetensors: tensor 'a': missing field 'data_offsets'"));
    EXPECT_THAT(malformed("st_f6", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "xxxx"),
                HasSubstr("bad.safetensors: tensor 'a': field 'data_offsets' is not two non-negative integers"));
    EXPECT_THAT(malformed("st_f7", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", "xxxx"),
                HasSubstr("field 'data_offsets' is not two non-negative integers"));
    EXPECT_THAT(malformed("st_f8", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", "xxxx"),
                HasSubstr("field 'data_offsets' is not two non-negative integers"));
    EXPECT_THAT(malformed("st_f9", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":"0,4"}})", "xxxx"),
                HasSubstr("field 'data_offsets' is not two non-negative integers"));
    EXPECT_THAT(malformed("st_f10", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}})", "xxxx"),
                HasSubstr("field 'data_offsets' is not two non-negative integers"));
    EXPECT_THAT(malformed("st_f11", R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "xxxx"),
                HasSubstr("bad.safetensors: header has a tensor with an empty name"));
}

TEST(SafeTensorsMalformed, BadShapeDims) {
    EXPECT_THAT(malformed("st_neg", R"({"a":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,4]}})", "xxxx"),
                HasSubstr("bad.safetensors: tensor 'a': negative shape dimension -1 at index 1"));
    EXPECT_THAT(malformed("st_flt", R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "xxxx"),
                HasSubstr("bad.safetensors: tensor 'a': shape dimension 0 is not a non-negative 64-bit integer"));
    EXPECT_THAT(malformed("st_str", R"({"a":{"dtype":"F32","shape":["4"],"data_offsets":[0,4]}})", "xxxx"),
                HasSubstr("shape dimension 0 is not a non-negative 64-bit integer"));
    EXPECT_THAT(
        malformed("st_huge", R"({"a":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})", "xxxx"),
        HasSubstr("shape dimension 0 is not a non-negative 64-bit integer"));
    // numel * dtype size overflows uint64: must be an error, not a wrapped-around match with the byte length.
    EXPECT_THAT(malformed("st_ovf", R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})"),
                HasSubstr("bad.safetensors: tensor 'a': shape [4611686018427387904, 4] has too many elements"));
    EXPECT_THAT(malformed("st_ovf2", R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})"),
                HasSubstr("has too many elements"));
}

TEST(SafeTensorsMalformed, UnknownDtype) {
    const std::string msg = malformed("st_dtype", R"({"a":{"dtype":"F8_E9M9","shape":[4],"data_offsets":[0,4]}})",
                                      "xxxx");
    EXPECT_THAT(msg, HasSubstr("bad.safetensors: tensor 'a': unknown dtype 'F8_E9M9'"));
}

TEST(SafeTensorsMalformed, OffsetsOutOfRange) {
    std::string msg = malformed("st_range", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[100,104]}})",
                                std::string(8, '\0'));
    EXPECT_THAT(msg, HasSubstr("bad.safetensors: tensor 'b': data_offsets [100, 104] end lies beyond the data area "
                               "of 8 bytes"));
    msg = malformed("st_reversed", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", std::string(8, '\0'));
    EXPECT_THAT(msg, HasSubstr("bad.safetensors: tensor 'a': data_offsets [8, 4] has begin > end"));
}

TEST(SafeTensorsMalformed, OverlappingOffsets) {
    const std::string msg = malformed("st_overlap", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]},)"
                                                    R"("c":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                      std::string(20, '\0'));
    EXPECT_THAT(msg, HasSubstr("bad.safetensors: tensor 'c': data_offsets [4, 12] overlap those of tensor 'a' [0, 8]"));
}

TEST(SafeTensorsMalformed, ShapeTimesDtypeSizeNotByteLength) {
    const std::string msg = malformed("st_nbytes", R"({"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})",
                                      std::string(8, '\0'));
    EXPECT_THAT(msg, HasSubstr("bad.safetensors: tensor 'a': shape [2, 3] x BF16 (2 bytes) needs 12 bytes but "
                               "data_offsets span 8 bytes"));
}

TEST(SafeTensorsMalformed, Metadata) {
    EXPECT_THAT(malformed("st_meta1", R"({"__metadata__":{"format":"pt","n":3}})"),
                HasSubstr("bad.safetensors: __metadata__ value for 'n' is not a string"));
    EXPECT_THAT(malformed("st_meta2", R"({"__metadata__":["pt"]})"),
                HasSubstr("bad.safetensors: __metadata__ is not a JSON object"));
}

// ---------------------------------------------------------------------------------------------------------------------
// ModelFiles
// ---------------------------------------------------------------------------------------------------------------------

// A folder with model.safetensors holding up [172, 64] and norm [64] (F32, zeros).
fs::path single_file_model(const std::string& test) {
    const auto dir = test::temp_dir(test);
    static const std::vector<float> up(172 * 64, 0.0f), norm(64, 1.0f);
    write_safetensors(dir / "model.safetensors",
                      std::vector<TensorToWrite>{
                          {"model.layers.0.mlp.up_proj.weight", DType::F32, {172, 64}, as_bytes_of(up)},
                          {"model.norm.weight", DType::F32, {64}, as_bytes_of(norm)}});
    return dir;
}

TEST(ModelFiles, WrongShapeOnGet) {
    const auto dir = single_file_model("mf_shape");
    const ModelFiles files(dir);
    try {
        files.get("model.layers.0.mlp.up_proj.weight", std::vector<int64_t>{64, 172});
        ADD_FAILURE() << "no exception";
    } catch (const InputError& e) {
        EXPECT_THAT(e.what(), HasSubstr((dir / "model.safetensors").string() +
                                        ": tensor 'model.layers.0.mlp.up_proj.weight': shape mismatch: "
                                        "Expected [64, 172], Actual [172, 64]"));
    }
    // A different rank is a mismatch too.
    EXPECT_THROW(files.get("model.norm.weight", std::vector<int64_t>{64, 1}), InputError);
    EXPECT_NO_THROW(files.get("model.norm.weight", std::vector<int64_t>{64}));
}

TEST(ModelFiles, MissingTensorOnGet) {
    const auto dir = single_file_model("mf_missing");
    const ModelFiles files(dir);
    try {
        files.get("lm_head.weight", std::vector<int64_t>{512, 64});
        ADD_FAILURE() << "no exception";
    } catch (const InputError& e) {
        EXPECT_THAT(e.what(), HasSubstr("tensor 'lm_head.weight' not found in " + dir.string() + " (2 tensors)"));
    }
}

TEST(ModelFiles, FolderMissing) {
    const auto dir = test::temp_dir("mf_nodir") / "nope";
    const std::string msg = folder_error(dir);
    EXPECT_THAT(msg, HasSubstr("model folder " + dir.string() + " does not exist"));
}

TEST(ModelFiles, FolderWithNeitherFile) {
    const auto dir = test::temp_dir("mf_neither");
    write_file(dir / "config.json", "{}");
    const std::string msg = folder_error(dir);
    EXPECT_THAT(msg, HasSubstr(dir.string()));
    EXPECT_THAT(msg, HasSubstr("holds neither model.safetensors nor model.safetensors.index.json"));
}

// Two shards: shard 1 holds a [2, 2] (1, 2, 3, 4) and b [3]; shard 2 holds c [2] (5, 6). `index` is the index text.
fs::path sharded_model(const std::string& test, const std::string& index) {
    const auto dir = test::temp_dir(test);
    static const std::vector<float> a = {1, 2, 3, 4}, b = {0, 0, 0}, c = {5, 6};
    write_safetensors(dir / "model-00001-of-00002.safetensors",
                      std::vector<TensorToWrite>{{"a", DType::F32, {2, 2}, as_bytes_of(a)},
                                                 {"b", DType::F32, {3}, as_bytes_of(b)}});
    write_safetensors(dir / "model-00002-of-00002.safetensors",
                      std::vector<TensorToWrite>{{"c", DType::F32, {2}, as_bytes_of(c)}});
    write_file(dir / "model.safetensors.index.json", index);
    return dir;
}

const std::string kGoodIndex = R"({"metadata": {"total_size": 36}, "weight_map": {
    "a": "model-00001-of-00002.safetensors",
    "b": "model-00001-of-00002.safetensors",
    "c": "model-00002-of-00002.safetensors"}})";

TEST(ModelFiles, ShardedWithIndex) {
    const auto dir = sharded_model("mf_sharded", kGoodIndex);
    // A stray model.safetensors must be ignored when the index exists.
    write_file(dir / "model.safetensors", "garbage");
    const ModelFiles files(dir);
    ASSERT_EQ(files.files().size(), 2u);
    EXPECT_EQ(files.names(), (std::vector<std::string>{"a", "b", "c"}));

    const TensorRef a = files.get("a", std::vector<int64_t>{2, 2});
    EXPECT_EQ(a.file->path().filename(), "model-00001-of-00002.safetensors");
    std::vector<float> got(4);
    std::memcpy(got.data(), a.data(), 16);
    EXPECT_EQ(got, (std::vector<float>{1, 2, 3, 4}));

    const TensorRef c = files.get("c", std::vector<int64_t>{2});
    EXPECT_EQ(c.file->path().filename(), "model-00002-of-00002.safetensors");
    got.resize(2);
    std::memcpy(got.data(), c.data(), 8);
    EXPECT_EQ(got, (std::vector<float>{5, 6}));

    EXPECT_EQ(files.find("b")->file, a.file);  // each shard opened once
}

TEST(ModelFiles, IndexNamesMissingShard) {
    const auto dir = sharded_model("mf_noshard", R"({"weight_map": {
        "a": "model-00001-of-00002.safetensors",
        "c": "model-00003-of-00003.safetensors"}})");
    const std::string msg = folder_error(dir);
    EXPECT_THAT(msg, HasSubstr("model.safetensors.index.json"));
    EXPECT_THAT(msg, HasSubstr((dir / "model-00003-of-00003.safetensors").string() +
                               " (listed for tensor 'c') does not exist"));
}

TEST(ModelFiles, IndexNamesTensorAbsentFromShard) {
    const auto dir = sharded_model("mf_absent", R"({"weight_map": {
        "a": "model-00001-of-00002.safetensors",
        "c": "model-00001-of-00002.safetensors"}})");
    const std::string msg = folder_error(dir);
    EXPECT_THAT(msg, HasSubstr((dir / "model-00001-of-00002.safetensors").string() +
                               ": tensor 'c' listed in model.safetensors.index.json is not in this shard"));
}

TEST(ModelFiles, IndexShardOutsideFolder) {
    const auto dir = sharded_model("mf_escape", R"({"weight_map": {"a": "../model-00001-of-00002.safetensors"}})");
    EXPECT_THAT(folder_error(dir), HasSubstr("tensor 'a': shard name '../model-00001-of-00002.safetensors' is not a "
                                             "plain file name inside the model folder"));
    write_file(dir / "model.safetensors.index.json", R"({"weight_map": {"a": ".."}})");
    EXPECT_THAT(folder_error(dir), HasSubstr("is not a plain file name"));
}

TEST(ModelFiles, MalformedIndex) {
    const auto dir = sharded_model("mf_badindex", R"({"weight_map": )");
    EXPECT_THAT(folder_error(dir), HasSubstr("model.safetensors.index.json: index is not valid JSON"));
    write_file(dir / "model.safetensors.index.json", R"({"metadata": {}})");
    EXPECT_THAT(folder_error(dir), HasSubstr("model.safetensors.index.json: missing field 'weight_map'"));
    write_file(dir / "model.safetensors.index.json", R"({"weight_map": {"a": 1}})");
    EXPECT_THAT(folder_error(dir), HasSubstr("weight_map entry for tensor 'a' is not a string"));
}

TEST(ModelFiles, TensorInTwoShards) {
    const auto dir = sharded_model("mf_twice", kGoodIndex);
    static const std::vector<float> c = {7, 8};
    write_safetensors(dir / "model-00001-of-00002.safetensors",
                      std::vector<TensorToWrite>{{"a", DType::F32, {2}, as_bytes_of(c)},
                                                 {"b", DType::F32, {2}, as_bytes_of(c)},
                                                 {"c", DType::F32, {2}, as_bytes_of(c)}});
    const std::string msg = folder_error(dir);
    EXPECT_THAT(msg, HasSubstr(dir.string()));
    EXPECT_THAT(msg, HasSubstr("tensor 'c' is in two shards"));
}

TEST(ModelFiles, MalformedShardNamesTheShard) {
    const auto dir = sharded_model("mf_badshard", kGoodIndex);
    write_file(dir / "model-00002-of-00002.safetensors", "abc");
    const std::string msg = folder_error(dir);
    EXPECT_THAT(msg, HasSubstr("model-00002-of-00002.safetensors: file is 3 bytes"));
}

// ---------------------------------------------------------------------------------------------------------------------
// The shared tiny model
// ---------------------------------------------------------------------------------------------------------------------

TEST(ModelFiles, Stories260K) {
    const auto dir = test::shared_dir() / "models" / "stories260K";
    QUEST_REQUIRE_PATH(dir / "model.safetensors");
    const ModelFiles files(dir);
    ASSERT_EQ(files.files().size(), 1u);
    const SafeTensorsFile& f = *files.files()[0];
    std::cout << "stories260K: " << f.tensors().size() << " tensors\n";
    for (const auto& t : f.tensors())
        std::cout << "  " << t.name << " " << dtype_name(t.dtype) << " " << shape_to_string(t.shape) << "\n";

    const TensorRef emb = files.get("model.embed_tokens.weight", std::vector<int64_t>{512, 64});
    EXPECT_EQ(emb.info->dtype, DType::F32);
    const TensorRef gate = files.get("model.layers.0.mlp.gate_proj.weight", std::vector<int64_t>{172, 64});
    EXPECT_EQ(gate.info->dtype, DType::F32);
    EXPECT_EQ(files.get("model.layers.0.mlp.down_proj.weight", std::vector<int64_t>{64, 172}).info->dtype,
              DType::F32);
    EXPECT_EQ(files.get("model.norm.weight", std::vector<int64_t>{64}).info->dtype, DType::F32);
    EXPECT_THROW(files.get("model.layers.0.mlp.up_proj.weight", std::vector<int64_t>{64, 172}), InputError);
    EXPECT_EQ(f.metadata().count("format"), 1u);

    // Values are finite floats (reads the mapping end to end for the embedding).
    std::vector<float> v(size_t(emb.info->numel()));
    convert_to_f32(DType::F32, emb.data(), v.data(), v.size());
    for (float x : v) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace quest
