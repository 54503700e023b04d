package ai4dl.spark;

import java.util.Set;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.expressions.CallMethodViaReflection;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.SubqueryExpression;
import org.apache.spark.sql.catalyst.plans.logical.Command;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import scala.Function1;
import scala.collection.Iterator;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * The read-only guard of `ai4dl sql`: a Spark session extension whose check rule refuses, in every session of
 * the Thrift server (one per client connection), any statement that would change a table, a view, the catalog
 * or the server: every command except the allow-listed reading ones, and calls of Java methods by reflection.
 * An allow-list, not a deny-list: a command Spark or Delta adds later is refused until it is listed here.
 *
 * The server's own session registers the lake's tables before it is armed; {@link #arm()} is one-way (there is
 * no method a client could call through reflect() to disarm it, and reflect() itself is refused once armed).
 */
public final class ReadOnlyExtension extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
    private static volatile boolean armed = false;

    /** Commands that read: SHOW, DESCRIBE (Delta's DETAIL and HISTORY too), EXPLAIN, USE, SET, REFRESH. */
    static final Set<String> READING = Set.of(
        "ShowTables", "ShowTablesCommand", "ShowTablesExtended", "ShowTableExtended", "ShowNamespaces",
        "ShowNamespacesCommand", "ShowColumns", "ShowColumnsCommand", "ShowViews", "ShowViewsCommand",
        "ShowFunctions", "ShowFunctionsCommand", "ShowTableProperties", "ShowTablePropertiesCommand",
        "ShowPartitions", "ShowPartitionsCommand", "ShowCreateTable", "ShowCreateTableCommand",
        "ShowCreateTableAsSerdeCommand", "ShowCatalogs", "ShowCatalogsCommand", "ShowCurrentNamespace",
        "ShowCurrentNamespaceCommand", "DescribeRelation", "DescribeTableCommand", "DescribeColumn",
        "DescribeColumnCommand", "DescribeNamespace", "DescribeDatabaseCommand", "DescribeFunction",
        "DescribeFunctionCommand", "DescribeQueryCommand", "DescribeDeltaDetailCommand",
        "DescribeDeltaHistory", "DescribeDeltaHistoryCommand", "ExplainCommand", "SetCommand", "ResetCommand",
        "SetCatalogAndNamespace", "SetNamespaceCommand", "SetCatalogCommand", "RefreshTable",
        "RefreshTableCommand");

    public static void arm() {
        armed = true;
    }

    public static boolean isArmed() {
        return armed;
    }

    @Override
    public BoxedUnit apply(SparkSessionExtensions extensions) {
        extensions.injectCheckRule(new AbstractFunction1<SparkSession, Function1<LogicalPlan, BoxedUnit>>() {
            @Override
            public Function1<LogicalPlan, BoxedUnit> apply(SparkSession session) {
                return new Guard();
            }
        });
        return BoxedUnit.UNIT;
    }

    static final class Guard extends AbstractFunction1<LogicalPlan, BoxedUnit> {
        @Override
        public BoxedUnit apply(LogicalPlan plan) {
            if (armed) {
                check(plan);
            }
            return BoxedUnit.UNIT;
        }
    }

    static void check(LogicalPlan plan) {
        String name = plan.getClass().getSimpleName();
        if (plan instanceof Command && !READING.contains(name)) {
            throw new SecurityException("ai4dl sql is read-only: " + name + " is not allowed (SELECT, SHOW, "
                + "DESCRIBE, EXPLAIN, USE and SET are)");
        }
        Iterator<Expression> expressions = plan.expressions().iterator();
        while (expressions.hasNext()) {
            checkExpression(expressions.next());
        }
        Iterator<LogicalPlan> children = plan.children().iterator();
        while (children.hasNext()) {
            check(children.next());
        }
    }

    static void checkExpression(Expression expression) {
        if (expression instanceof CallMethodViaReflection) {
            throw new SecurityException("ai4dl sql is read-only: reflect() and java_method() are not allowed");
        }
        if (expression instanceof SubqueryExpression) {
            check(((SubqueryExpression) expression).plan());
        }
        Iterator<Expression> children = expression.children().iterator();
        while (children.hasNext()) {
            checkExpression(children.next());
        }
    }
}
