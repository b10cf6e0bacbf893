#include "kernels/cuda/device.h"

#include <string>

#include "gtest/gtest.h"
#include "kernels/cuda/attention.cuh"

namespace ring::cuda {
namespace {

TEST(ArchSpecTest, ParsesCMakeArchitectures) {
  std::vector<BuildArch> sass;
  std::vector<int> ptx;
  ParseArchSpec("90;120a,100a-real;80-virtual", &sass, &ptx);
  ASSERT_EQ(sass.size(), 3u);
  EXPECT_EQ(sass[0].cc, 90);
  EXPECT_FALSE(sass[0].arch_specific);
  EXPECT_EQ(sass[1].cc, 120);
  EXPECT_TRUE(sass[1].arch_specific);
  EXPECT_EQ(sass[2].cc, 100);
  EXPECT_EQ(ptx, (std::vector<int>{90, 120, 80}));
}

TEST(ArchSpecTest, SassCompatibility) {
  EXPECT_TRUE(SassRunsOn({90, false}, 90));
  EXPECT_FALSE(SassRunsOn({90, false}, 100));   // another major: needs PTX
  EXPECT_TRUE(SassRunsOn({120, false}, 121));   // same major, newer minor (GB10 on sm_120)
  EXPECT_FALSE(SassRunsOn({120, true}, 121));   // sm_120a runs on 12.0 only
  EXPECT_TRUE(SassRunsOn({121, true}, 121));
  EXPECT_FALSE(SassRunsOn({121, false}, 120));
}

CodeAttestation Fake(int cc, const std::string& spec) {
  CodeAttestation a;
  a.device.name = "Test GPU";
  a.device.cc = cc;
  ParseArchSpec(spec, &a.sass, &a.ptx);
  for (const BuildArch& b : a.sass) a.sass_match = a.sass_match || SassRunsOn(b, cc);
  return a;
}

TEST(AttestationTest, RefusesPtxJitUnlessAllowed) {
  EXPECT_TRUE(CheckAttestation(Fake(90, "90;120a"), false).ok());
  EXPECT_TRUE(CheckAttestation(Fake(121, "90;121a"), false).ok());
  const CodeAttestation thor = Fake(110, "90;120a");  // Jetson Thor on a 5090-only build
  const absl::Status s = CheckAttestation(thor, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("sm_110"), std::string::npos) << s;
  EXPECT_NE(s.message().find("sm_90,sm_120a"), std::string::npos) << s;
  EXPECT_TRUE(CheckAttestation(thor, true).ok());
  EXPECT_NE(thor.ToString().find("JIT from PTX"), std::string::npos);
}

// The default build carries sm_90a (wgmma) for Hopper: arch-specific SASS runs on exactly cc 90.
TEST(AttestationTest, Sm90aRunsOnHopperOnly) {
  EXPECT_TRUE(CheckAttestation(Fake(90, "90a;120a"), false).ok());
  EXPECT_FALSE(CheckAttestation(Fake(100, "90a;120a"), false).ok());
}

// `ringctl describe` shows the summary: whether the worker shares its GPU context via MPS.
TEST(AttestationTest, SummaryNamesMps) {
  CodeAttestation a = Fake(90, "90a");
  EXPECT_NE(a.ToString().find("no MPS"), std::string::npos) << a.ToString();
  a.device.mps = true;
  EXPECT_NE(a.ToString().find("MPS client"), std::string::npos) << a.ToString();
}

// RING_CUDA_SMEM_PER_BLOCK lowers the limit the kernel choices read (never raises it) and
// refuses what is not a byte count.
TEST(SmemCapTest, LowersTheOptInLimitOnly) {
  DeviceInfo d;
  d.smem_per_block_optin = 232448;  // H200
  ASSERT_TRUE(internal::ApplySmemCap(nullptr, &d).ok());
  ASSERT_TRUE(internal::ApplySmemCap("", &d).ok());
  EXPECT_EQ(d.smem_per_block_optin, 232448);
  EXPECT_EQ(d.smem_per_block_hw, 0);
  ASSERT_TRUE(internal::ApplySmemCap("101376", &d).ok());
  EXPECT_EQ(d.smem_per_block_optin, 101376);
  EXPECT_EQ(d.smem_per_block_hw, 232448);
  EXPECT_NE(d.ToString().find("capped by RING_CUDA_SMEM_PER_BLOCK; the device has 232448"),
            std::string::npos)
      << d.ToString();
  DeviceInfo small;
  small.smem_per_block_optin = 101376;
  ASSERT_TRUE(internal::ApplySmemCap("232448", &small).ok());
  EXPECT_EQ(small.smem_per_block_optin, 101376);
  EXPECT_EQ(small.smem_per_block_hw, 0);
  for (const char* bad : {"99KB", "-1", "1024", "1e5"}) {
    const absl::Status s = internal::ApplySmemCap(bad, &small);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("RING_CUDA_SMEM_PER_BLOCK"), std::string::npos) << s;
  }
}

// The MLA kernels follow a block's shared memory: an H200's 227 KB takes the wide forms,
// GB10's / the RTX 5090's 99 KB the narrow ones, and a device with less the portable ones.
TEST(MlaFormsTest, SharedMemoryPicksTheForms) {
  DeviceInfo h200;
  h200.cc = 90;
  h200.smem_per_block_optin = 232448;
  EXPECT_EQ(ChooseMlaDecodeForm(h200), MlaDecodeForm::kTensorCore);
  EXPECT_EQ(MlaSparsePrefillHeadsPerBlock(h200), 64);
  EXPECT_EQ(ChooseMlaPrefillForm(h200, 192, 256).value_slice, 128);
  EXPECT_EQ(ChooseMlaPrefillForm(h200, 192, 256).key_tile, 64);
  DeviceInfo gb10 = h200;
  gb10.cc = 121;
  gb10.smem_per_block_optin = 101376;
  EXPECT_EQ(ChooseMlaDecodeForm(gb10), MlaDecodeForm::kTensorCore);
  EXPECT_EQ(MlaSparsePrefillHeadsPerBlock(gb10), 32);
  const std::string forms = MlaKernelForms(gb10);
  EXPECT_NE(forms.find("decode tensor cores"), std::string::npos) << forms;
  EXPECT_NE(forms.find("32 heads a block"), std::string::npos) << forms;
  // GLM-5's dense prefill (111 KB at 128-dim value slices of 64-key tiles) takes 32-key
  // tiles there; DeepSeek-V3's (nope 128, v 128: 95 KB) keeps 64-key tiles.
  EXPECT_EQ(ChooseMlaPrefillForm(gb10, 192, 256).value_slice, 128);
  EXPECT_EQ(ChooseMlaPrefillForm(gb10, 192, 256).key_tile, 32);
  EXPECT_EQ(ChooseMlaPrefillForm(gb10, 128, 128).key_tile, 64);
  EXPECT_NE(forms.find("rope in the kernel, 128-dim value slices, 32-key tiles (61440 B)"), std::string::npos)
      << forms;
  DeviceInfo tight = gb10;  // a byte short of the 32-key form; the 64-dim one needs 95 KB
  tight.smem_per_block_optin = 61439;
  EXPECT_EQ(ChooseMlaPrefillForm(tight, 192, 256).value_slice, 0);
  DeviceInfo small = h200;
  small.smem_per_block_optin = 49152;
  EXPECT_EQ(ChooseMlaDecodeForm(small), MlaDecodeForm::kSimt);
  EXPECT_EQ(MlaSparsePrefillHeadsPerBlock(small), 0);
  EXPECT_EQ(ChooseMlaPrefillForm(small, 192, 256).value_slice, 0);
  EXPECT_NE(MlaKernelForms(small).find("rope scores as an additive mask"), std::string::npos)
      << MlaKernelForms(small);
  DeviceInfo turing = h200;
  turing.cc = 75;
  EXPECT_EQ(ChooseMlaDecodeForm(turing), MlaDecodeForm::kSimt);
  EXPECT_NE(MlaKernelForms(turing).find("decode portable SIMT; sparse prefill expanded form"),
            std::string::npos)
      << MlaKernelForms(turing);
}

}  // namespace
}  // namespace ring::cuda
