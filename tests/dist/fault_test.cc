#include "lib/dist/fault.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "lib/base/error.h"

namespace fd::dist {
namespace {

TEST(FaultSpec, ParsesEveryKind) {
  FaultSpec k = parse_fault("kill:rank=1:step=5");
  EXPECT_EQ(k.kind, FaultSpec::kKill);
  EXPECT_EQ(k.rank, 1);
  EXPECT_EQ(k.step, 5);
  FaultSpec s = parse_fault("stall:step=7:rank=3");
  EXPECT_EQ(s.kind, FaultSpec::kStall);
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.step, 7);
  FaultSpec t = parse_fault("throw:rank=0:step=3");
  EXPECT_EQ(t.kind, FaultSpec::kThrow);
  EXPECT_EQ(t.rank, 0);
  EXPECT_EQ(t.step, 3);
  EXPECT_EQ(parse_fault("").kind, FaultSpec::kNone);
}

TEST(FaultSpec, MalformedIsUsageErrorNamingTheVariable) {
  for (const char* bad :
       {"kill", "explode:rank=1:step=2", "kill:rank=1", "kill:step=1", "kill:rank=x:step=1",
        "kill:rank=1:step=-2", "kill:rank=1:step=2:foo=3", "kill:rank=1:rank=2:step=1",
        "kill:rank=1:step=", "kill:rank=1:step=5:", "Kill:rank=1:step=5"}) {
    try {
      parse_fault(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << bad;
      EXPECT_NE(std::string(e.what()).find("FDTRAIN_FAULT"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

TEST(FaultSpec, FromEnv) {
  unsetenv("FDTRAIN_FAULT");
  EXPECT_EQ(fault_from_env().kind, FaultSpec::kNone);
  setenv("FDTRAIN_FAULT", "throw:rank=2:step=9", 1);
  FaultSpec f = fault_from_env();
  EXPECT_EQ(f.kind, FaultSpec::kThrow);
  EXPECT_EQ(f.rank, 2);
  EXPECT_EQ(f.step, 9);
  setenv("FDTRAIN_FAULT", "bogus", 1);
  EXPECT_THROW(fault_from_env(), Error);
  unsetenv("FDTRAIN_FAULT");
}

TEST(FaultSpec, ThrowFiresOnlyAtItsRankAndStep) {
  FaultSpec f = parse_fault("throw:rank=0:step=3");
  EXPECT_NO_THROW(inject_fault(f, 0, 2));
  EXPECT_NO_THROW(inject_fault(f, 1, 3));
  try {
    inject_fault(f, 0, 3);
    ADD_FAILURE() << "did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
    EXPECT_NE(std::string(e.what()).find("injected fault"), std::string::npos);
  }
  EXPECT_NO_THROW(inject_fault(FaultSpec{}, 0, 3));
}

TEST(FaultSpecDeathTest, KillRaisesSigkill) {
  FaultSpec f = parse_fault("kill:rank=1:step=5");
  EXPECT_EXIT(inject_fault(f, 1, 5), ::testing::KilledBySignal(SIGKILL), "injected fault");
}

}  // namespace
}  // namespace fd::dist
