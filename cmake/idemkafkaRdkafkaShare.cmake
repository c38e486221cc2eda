# What the librdkafka found offers for share groups (KIP-932, queues for Kafka), asked of the
# library itself (a program compiled and linked against idemkafka_dep::rdkafka, never run), so
# it holds however librdkafka was found; asked again at each configure:
#   IDEMKAFKA_RDKAFKA_SHARE       the share consumer's C API: rd_kafka_share_consumer_new,
#                                 batches from rd_kafka_share_poll, explicit acknowledgement,
#                                 delivery counts, commit_sync/async (a preview in 2.15)
#   IDEMKAFKA_RDKAFKA_SHARE_MOCK  the mock cluster's share-group settings: lock duration,
#                                 delivery-count limit, auto offset reset, session timeout;
#                                 and its manual assignment (member ids, target assignment)
# Only the build uses this module; the installed package has its answer in
# <idemkafka/features.hpp> (IDEMKAFKA_HAS_SHARE_CONSUMER).
include(CheckCXXSourceCompiles)
include(CMakePushCheckState)

function(idemkafka_check_rdkafka_source var source)
  cmake_push_check_state(RESET)
  set(CMAKE_REQUIRED_LIBRARIES idemkafka_dep::rdkafka)
  set(CMAKE_REQUIRED_QUIET ON)
  unset(${var} CACHE)
  check_cxx_source_compiles("${source}" ${var})
  cmake_pop_check_state()
endfunction()

idemkafka_check_rdkafka_source(IDEMKAFKA_RDKAFKA_SHARE "
#include <librdkafka/rdkafka.h>
int main()
{
    char errstr[64];
    rd_kafka_share_t* share = rd_kafka_share_consumer_new(nullptr, errstr, sizeof errstr);
    rd_kafka_messages_t* batch = nullptr;
    rd_kafka_topic_partition_list_t* results = nullptr;
    const rd_kafka_share_AcknowledgeType_t release = RD_KAFKA_SHARE_ACKNOWLEDGE_TYPE_RELEASE;
    return rd_kafka_share_poll(share, 0, &batch) == nullptr &&
           rd_kafka_messages_count(batch) == 0 &&
           rd_kafka_share_acknowledge_type(share, rd_kafka_messages_get(batch, 0), release) == 0 &&
           rd_kafka_message_delivery_count(nullptr) == 0 &&
           rd_kafka_share_commit_sync(share, 0, &results) == nullptr &&
           rd_kafka_share_commit_async(share) == nullptr &&
           rd_kafka_share_consumer_close(share) == nullptr &&
           rd_kafka_share_destroy_flags(share, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE) == nullptr;
}
")

idemkafka_check_rdkafka_source(IDEMKAFKA_RDKAFKA_SHARE_MOCK "
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
int main()
{
    rd_kafka_mock_cluster_t* mcluster = nullptr;
    rd_kafka_mock_sharegroup_set_record_lock_duration(mcluster, 1);
    rd_kafka_mock_sharegroup_set_max_delivery_attempts(mcluster, 1);
    rd_kafka_mock_sharegroup_set_max_record_locks(mcluster, 1);
    rd_kafka_mock_sharegroup_set_auto_offset_reset(mcluster, 1);
    rd_kafka_mock_sharegroup_set_session_timeout(mcluster, 1);
    rd_kafka_mock_sharegroup_set_heartbeat_interval(mcluster, 1);
    char** member_ids = nullptr;
    size_t member_cnt = 0;
    rd_kafka_topic_partition_list_t* assignment = nullptr;
    rd_kafka_mock_sharegroup_target_assignment(mcluster, \"g\", const_cast<const char**>(member_ids), &assignment, 0);
    return rd_kafka_mock_sharegroup_get_member_ids(mcluster, \"g\", &member_ids, &member_cnt);
}
")

if(IDEMKAFKA_RDKAFKA_SHARE)
  message(STATUS "idemkafka: librdkafka has the share consumer (KIP-932): IdempotentShareConsumer and the share tests built")
else()
  message(STATUS "idemkafka: librdkafka has no share consumer (KIP-932, 2.15 or later): no IdempotentShareConsumer, share tests skipped")
endif()
