#pragma once
// Parameterised and prepared statements on every libpqxx we build against.
// libpqxx 7.10 deprecates `exec_params()` and `exec_prepared()` in favour of
// `exec(sql, params)` and `exec(prepped, params)`, which older versions lack.
// Used by the library, the tests, the benchmark and idemkafka-admin.

#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <pqxx/pqxx>
#include <pqxx/version>

namespace idemkafka::detail::pg {

#if PQXX_VERSION_MAJOR > 7 || (PQXX_VERSION_MAJOR == 7 && PQXX_VERSION_MINOR >= 10)

/// A number as the text libpqxx would send for it. `params` stores a number by
/// moving a temporary `std::variant`, where g++ 12 at -O2 in C++20 warns of a
/// maybe-uninitialized `nullptr_t` alternative (a false positive); a string it
/// takes through an out-of-line overload.
template <class T> decltype(auto) param(T&& value)
{
    if constexpr (std::is_arithmetic_v<std::remove_cv_t<std::remove_reference_t<T>>>)
        return pqxx::to_string(value);
    else
        return std::forward<T>(value);
}

/// `sql` with `$1`, `$2`... bound to `args`: what `tx.exec_params(sql, args...)` did.
template <class... Args> pqxx::result exec_params(pqxx::transaction_base& tx, std::string_view sql, Args&&... args)
{
    return tx.exec(sql, pqxx::params{param(std::forward<Args>(args))...});
}

/// The statement prepared as `name`, with `args`: what `tx.exec_prepared(name, args...)` did.
template <class... Args> pqxx::result exec_prepared(pqxx::transaction_base& tx, pqxx::zview name, Args&&... args)
{
    return tx.exec(pqxx::prepped{name}, pqxx::params{param(std::forward<Args>(args))...});
}

#else // libpqxx 6.x to 7.9: the member functions, not deprecated there

template <class... Args> pqxx::result exec_params(pqxx::transaction_base& tx, const std::string& sql, Args&&... args)
{
    return tx.exec_params(sql, std::forward<Args>(args)...);
}

template <class... Args> pqxx::result exec_prepared(pqxx::transaction_base& tx, const std::string& name, Args&&... args)
{
    return tx.exec_prepared(name, std::forward<Args>(args)...);
}

#endif

/// Whether `qualified` (a schema-qualified, quoted name) names a table or
/// other relation the session can see.
inline bool relation_exists(pqxx::transaction_base& tx, const std::string& qualified)
{
    return exec_params(tx, "SELECT to_regclass($1) IS NOT NULL", qualified)[0][0].as<bool>();
}

} // namespace idemkafka::detail::pg
