#include "pg/watch.hpp"

#include "pg/connect.hpp"

#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include <sys/socket.h>
#include <sys/stat.h>

namespace idemkafka::detail::pg {
namespace {

std::int64_t now_ns() noexcept
{
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// How often the watchdog looks at the armed deadlines: a deadline is kept to
// within this. Nothing runs while no watch is attached.
constexpr std::chrono::milliseconds tick{100};

} // namespace

// One thread for the process, started at the first attach(), never ended (it
// sleeps while nothing is attached), so no static destructor waits for it.
class Watchdog {
public:
    static Watchdog& instance()
    {
        static Watchdog* const dog = new Watchdog; // never destroyed: see above
        return *dog;
    }

    void add(Watch* w, int fd, std::uint64_t dev, std::uint64_t ino)
    {
        {
            std::lock_guard<std::mutex> lock(mu_);
            w->fd_ = fd;
            w->dev_ = dev;
            w->ino_ = ino;
            watches_.insert(w);
            if (!started_) {
                started_ = true;
                std::thread([this] { loop(); }).detach();
            }
        }
        cv_.notify_one();
    }

    void remove(Watch* w) noexcept
    {
        std::lock_guard<std::mutex> lock(mu_);
        watches_.erase(w);
        w->fd_ = -1;
    }

    bool cut(Watch& w) noexcept
    {
        std::lock_guard<std::mutex> lock(mu_);
        return watches_.count(&w) > 0 && cut_locked(w);
    }

private:
    // The socket is shut down only while it is still the one attached: its
    // descriptor stays open (the connection owns it), but libpqxx 6 may have
    // re-opened the connection, and the number may now be another socket's.
    static bool cut_locked(Watch& w) noexcept
    {
        if (w.fd_ < 0)
            return false;
        struct stat st {};
        if (::fstat(w.fd_, &st) != 0 || static_cast<std::uint64_t>(st.st_dev) != w.dev_ ||
            static_cast<std::uint64_t>(st.st_ino) != w.ino_)
            return false;
        return ::shutdown(w.fd_, SHUT_RDWR) == 0;
    }

    void loop() noexcept
    {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
            cv_.wait(lock, [this] { return !watches_.empty(); });
            const auto now = now_ns();
            for (Watch* w : watches_) {
                const auto deadline = w->deadline_.load(std::memory_order_relaxed);
                if (deadline == 0 || deadline > now)
                    continue;
                w->deadline_.store(0, std::memory_order_relaxed);
                if (cut_locked(*w))
                    w->fired_.store(true);
            }
            cv_.wait_for(lock, tick);
        }
    }

    std::mutex mu_;
    std::condition_variable cv_;
    std::set<Watch*> watches_;
    bool started_ = false;
};

void Watch::attach(const pqxx::connection& db)
{
    detach();
    const int fd = db.sock();
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0)
        return;
    deadline_.store(0);
    fired_.store(false);
    attached_ = true;
    Watchdog::instance().add(this, fd, static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino));
}

void Watch::detach() noexcept
{
    if (!attached_)
        return;
    Watchdog::instance().remove(this);
    attached_ = false;
}

void Watch::arm(std::chrono::milliseconds limit) noexcept
{
    if (limit.count() <= 0) {
        disarm();
        return;
    }
    deadline_.store(now_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(limit).count(),
                    std::memory_order_relaxed);
}

bool Watch::cut() noexcept
{
    return Watchdog::instance().cut(*this);
}

void Session::connect(const std::string& conninfo)
{
    disconnect();
    db = pg::connect(conninfo);
    watch.attach(*db);
}

void Session::disconnect() noexcept
{
    if (kept.held()) {
        watch.cut();
        kept.drop();
    }
    watch.detach();
    db.reset();
}

} // namespace idemkafka::detail::pg
