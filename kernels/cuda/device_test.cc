#include "kernels/cuda/device.h"

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace ring::cuda
